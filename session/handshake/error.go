package handshake

import "fmt"

// Error is a failed handshake: a Reject (Code != 0) sent by this side or
// received from the other (Remote), or an abort (Code == 0) such as a
// connection closed early.
type Error struct {
	Code     uint16
	Reason   string
	WorkerID string // the claimed or dialed worker id, when known
	Remote   bool   // the other side sent the Reject
	From     string // who sent a remote Reject: "server" or "worker"
	Err      error  // cause of an abort, if any
}

func (e *Error) Error() string {
	switch {
	case e.Code == 0:
		if e.Err != nil {
			return fmt.Sprintf("%s: %v", e.Reason, e.Err)
		}
		return e.Reason
	case e.Remote:
		return fmt.Sprintf("%s rejected connection (code %d): %s", e.From, e.Code, e.Reason)
	}
	return fmt.Sprintf("rejected connection (code %d): %s", e.Code, e.Reason)
}

func (e *Error) Unwrap() error { return e.Err }
