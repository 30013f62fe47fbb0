package httpguard

import "syscall"

var errEMFILE = syscall.EMFILE
