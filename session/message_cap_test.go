package session

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestMessageCapBothDirections(t *testing.T) {
	for _, dir := range []string{"to accepted end", "to dialed end"} {
		a, d := loopback(t)
		from, to := d, a
		if dir == "to dialed end" {
			from, to = a, d
		}
		ctx := context.Background()
		fits := bytes.Repeat([]byte{7}, MaxProtoMessageSize)
		go from.WriteMessage(ctx, fits)
		got, err := to.ReadMessage(ctx)
		if err != nil || len(got) != MaxProtoMessageSize {
			t.Fatalf("%s: 8 MiB message: %d bytes, %v", dir, len(got), err)
		}
		go from.WriteMessage(ctx, append(fits, 0))
		_, err = to.ReadMessage(ctx)
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%s: oversized message: %v", dir, err)
		}
	}
}
