package session

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"gradient.dev/gradient/wire"
)

// A proxy's relay over real WebSockets: NAR chunks the server sends at
// version 33 are received by the proxy's upstream reader and relayed,
// frame for frame, by a writer at version 30 to the worker, which gets
// each frame byte for byte as the server encoded it, while the relayed
// buffers go back to the read pool and take the next chunks.
func TestRelayedFramesArriveUnchanged(t *testing.T) {
	srvEnd, proxyUp := loopback(t)
	proxyDown, workerEnd := loopback(t)
	server := NewWriter(srvEnd, 33, ServerCodec, 10*time.Second, discardLogger())
	up := NewReader(proxyUp, 33, ServerCodec, discardLogger())
	down := NewWriter(proxyDown, 30, ServerCodec, 10*time.Second, discardLogger())
	worker := NewReader(workerEnd, 30, ServerCodec, discardLogger())
	defer server.Close()
	defer down.Close()

	const chunks = 40
	push := func(i int) *wire.NarPush {
		data := make([]byte, BulkChunkSize-i) // sizes vary, so frames differ in length
		for j := range data {
			data[j] = byte(i + j)
		}
		return &wire.NarPush{JobID: "job", StorePath: "/nix/store/x", Data: data, Offset: uint64(i), IsFinal: i == chunks-1}
	}
	go func() {
		for i := range chunks {
			if err := server.Send(push(i)); err != nil {
				return
			}
		}
	}()
	relayed := make(chan error, 1)
	go func() {
		for range chunks {
			m, err := up.Recv(context.Background())
			if err != nil {
				relayed <- err
				return
			}
			f, ok, err := down.Relay(up.Frame(), up.Version(), m)
			if err != nil || !ok {
				relayed <- errors.Join(err, errors.New("NarPush not relayed"))
				return
			}
			up.Forget()
			if err := down.SendFrame(f); err != nil {
				relayed <- err
				return
			}
		}
		relayed <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range chunks {
		if _, err := worker.Recv(ctx); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		want, err := wire.AppendServerMessage(nil, push(i), 33)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(worker.Frame(), want) {
			t.Fatalf("chunk %d arrived as %d bytes differing from the server's %d", i, len(worker.Frame()), len(want))
		}
		worker.Release()
	}
	if err := <-relayed; err != nil {
		t.Fatal(err)
	}
}

// A variant the writer's version encodes otherwise is encoded, not
// relayed: the peer must be able to decode it at its own version.
func TestRelayEncodesWhatVersionsEncodeOtherwise(t *testing.T) {
	a, _ := Pipe()
	w := NewWriter(a, 32, ClientCodec, time.Second, discardLogger())
	defer w.Close()
	peak := []wire.Pair[string, uint64]{{First: "/nix/store/x.drv", Second: 512}}
	m := &wire.WorkerMetrics{CPUUsagePct: 50, BuildPeakRAMMB: &peak}
	frame, err := wire.AppendClientMessage(nil, m, 33)
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeClientMessage(frame, 33)
	if err != nil {
		t.Fatal(err)
	}
	f, relayed, err := w.Relay(frame, 33, got)
	if err != nil || relayed {
		t.Fatalf("WorkerMetrics from 33 to 32: relayed %v, %v", relayed, err)
	}
	if _, err := wire.DecodeClientMessage(f.b, 32); err != nil {
		t.Fatalf("the frame for 32 does not decode at 32: %v", err)
	}
	if bytes.Equal(f.b, frame) {
		t.Fatal("the frame for 32 is the one received at 33")
	}

	// A variant newer than the writer's version is refused, as Encode
	// refuses it.
	sw := NewWriter(a, 31, ServerCodec, time.Second, discardLogger())
	defer sw.Close()
	imp := &wire.ImportResult{JobID: "j", RequestID: "i", Outcome: &wire.ImportUnknown{DrvPath: "/nix/store/x.drv"}}
	frame, err = wire.AppendServerMessage(nil, imp, 33)
	if err != nil {
		t.Fatal(err)
	}
	if _, relayed, err := sw.Relay(frame, 33, imp); relayed || err == nil {
		t.Fatalf("ImportResult from 33 to 31: relayed %v, error %v", relayed, err)
	}
}
