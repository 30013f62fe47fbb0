package session

import "sync"

// Encode buffers are recycled once the writer task wrote them: a 512 KiB
// NAR chunk stream then encodes without allocating per chunk. Buffers that
// grew beyond one bulk chunk plus headroom are dropped so the pool holds no
// giant slabs.
var encodePool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

const maxPooledBuffer = BulkChunkSize + 64<<10

func getBuffer() []byte { return (*encodePool.Get().(*[]byte))[:0] }

func putBuffer(b []byte) {
	if cap(b) == 0 || cap(b) > maxPooledBuffer {
		return
	}
	b = b[:0]
	encodePool.Put(&b)
}
