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

// Received message buffers come from size classes. A buffer enters a class
// only through Reader.Release (the caller declared the message and every
// slice of it unused), straight from the read path when it was never
// handed out, or from a Writer that wrote it as a relayed frame (recycle),
// so a buffer a message may still reference is never reused.
// The pool holds buffers across at most two garbage collections: an idle
// session keeps none.
var readClasses = [...]int{
	4 << 10, 16 << 10, 64 << 10, 256 << 10,
	BulkChunkSize + 4<<10, // a NAR or upload chunk plus its message header (bulkReadClass)
	1 << 20, 2 << 20, 4 << 20,
	MaxProtoMessageSize,
}

// bulkReadClass is the index of the class of a NAR or upload chunk.
const bulkReadClass = 4

var readPools [len(readClasses)]sync.Pool

// getReadBuffer returns an empty buffer with capacity of at least n (or
// MaxProtoMessageSize, the most a message can be).
func getReadBuffer(n int) []byte {
	for i, size := range readClasses {
		if size >= n || i == len(readClasses)-1 {
			if p, ok := readPools[i].Get().(*[]byte); ok {
				return (*p)[:0]
			}
			return make([]byte, 0, size)
		}
	}
	panic("unreachable")
}

// putReadBuffer returns b to the class its capacity is exactly; other
// buffers (exact-size small messages) are left to the garbage collector.
func putReadBuffer(b []byte) {
	c := cap(b)
	for i, size := range readClasses {
		if size == c {
			b = b[:0]
			readPools[i].Put(&b)
			return
		}
		if size > c {
			return
		}
	}
}

// recycle returns a buffer the writer wrote to its pool: a relayed
// received frame (Writer.Relay) of a NAR chunk's class or larger to its
// read class, so the reader that received it reuses it; anything else to
// the encode pool. An encode buffer of such a capacity (none of the NAR
// chunk's, which is no whole number of pages as grown encode buffers are;
// the larger ones the encode pool would drop) lands in the read pool
// harmlessly: no buffer is referenced once written.
func recycle(b []byte) {
	c := cap(b)
	for _, size := range readClasses[bulkReadClass:] {
		if size == c {
			putReadBuffer(b)
			return
		}
	}
	putBuffer(b)
}
