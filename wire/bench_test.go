package wire

import (
	"fmt"
	"testing"
)

// Each benchmark encodes into a reused buffer and decodes the frame, the way
// a session does per message. Run: go test -bench . -benchmem ./wire

func benchClient(b *testing.B, m ClientMessage) {
	b.ReportAllocs()
	buf := make([]byte, 0, 1<<10)
	var err error
	for b.Loop() {
		buf, err = AppendClientMessage(buf[:0], m, NewestVersion)
		if err != nil {
			b.Fatal(err)
		}
		if _, err = DecodeClientMessage(buf, NewestVersion); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func benchServer(b *testing.B, m ServerMessage) {
	b.ReportAllocs()
	buf := make([]byte, 0, 1<<10)
	var err error
	for b.Loop() {
		buf, err = AppendServerMessage(buf[:0], m, NewestVersion)
		if err != nil {
			b.Fatal(err)
		}
		if _, err = DecodeServerMessage(buf, NewestVersion); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkRequestJob(b *testing.B) { benchClient(b, &RequestJob{Kind: JobKindBuild}) }

// The target message: a small control reply with a UUID job id.
func BenchmarkAssignJobResponse(b *testing.B) {
	benchClient(b, &AssignJobResponse{JobID: "0b9f5c1e-6a51-4d0e-9a8a-3f1f2d6c7b10", Accepted: true})
}

func sampleBuildJob(n int) *AssignJob {
	job := &BuildJob{Requirement: BuildRequirement{Architecture: "x86_64-linux", RequiredFeatures: []string{"big-parallel"}}}
	for i := range n {
		job.Builds = append(job.Builds, BuildSpec{
			BuildID:     fmt.Sprintf("0b9f5c1e-6a51-4d0e-9a8a-%012d", i),
			DrvPath:     fmt.Sprintf("/nix/store/%032d-hello-2.12.1.drv", i),
			Outputs:     []DerivationOutput{{Name: "out", Path: fmt.Sprintf("/nix/store/%032d-hello-2.12.1", i)}},
			TimeoutSecs: ptr[uint64](14400), MaxSilentSecs: ptr[uint64](3600),
		})
	}
	return &AssignJob{JobID: "0b9f5c1e-6a51-4d0e-9a8a-3f1f2d6c7b10", AssignmentID: "5d1c2b7e-31f4-4b1a-8a0e-2b8d7f1c9e44", Job: job}
}

func BenchmarkAssignJobBuild(b *testing.B) { benchServer(b, sampleBuildJob(4)) }

func BenchmarkJobOffer1000(b *testing.B) {
	offer := &JobOffer{}
	for i := range 1000 {
		offer.Candidates = append(offer.Candidates, JobCandidate{
			JobID:         fmt.Sprintf("0b9f5c1e-6a51-4d0e-9a8a-%012d", i),
			RequiredPaths: []RequiredPath{{Path: fmt.Sprintf("/nix/store/%032d-glibc-2.39", i), CacheInfo: &CacheInfo{FileSize: 1 << 20, NarSize: 4 << 20}}},
			DrvPaths:      []string{fmt.Sprintf("/nix/store/%032d-hello.drv", i)},
			OutputPaths:   []string{fmt.Sprintf("/nix/store/%032d-hello", i)},
			Requirement:   &BuildRequirement{Architecture: "x86_64-linux"},
		})
	}
	benchServer(b, offer)
}

// A 512 KiB NAR chunk: encoding copies the payload into the frame once;
// decoding must not copy it again (one allocation for the message, two for
// its strings).
func BenchmarkNarPush512K(b *testing.B) {
	benchServer(b, &NarPush{JobID: "0b9f5c1e-6a51-4d0e-9a8a-3f1f2d6c7b10", StorePath: "/nix/store/00000000000000000000000000000000-hello",
		Data: make([]byte, 512<<10), Offset: 1 << 20})
}

// Decoding alone: its cost must not grow with the payload.
func BenchmarkNarPush512KDecode(b *testing.B) {
	frame, _ := AppendServerMessage(nil, &NarPush{JobID: "j", StorePath: "/nix/store/x", Data: make([]byte, 512<<10)}, NewestVersion)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if _, err := DecodeServerMessage(frame, NewestVersion); err != nil {
			b.Fatal(err)
		}
	}
}

// A minimal hand-written encoder and decoder of AssignJobResponse: the floor
// the generated code is measured against.
func BenchmarkAssignJobResponseHandWritten(b *testing.B) {
	type msg struct {
		jobID    string
		accepted bool
		reason   *string
	}
	m := &msg{jobID: "0b9f5c1e-6a51-4d0e-9a8a-3f1f2d6c7b10", accepted: true}
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	var sink *msg
	for b.Loop() {
		buf = append(buf[:0], 8, byte(len(m.jobID)))
		buf = append(buf, m.jobID...)
		buf = append(buf, 1, 0)
		if buf[0] != 8 {
			b.Fatal("tag")
		}
		n := int(buf[1])
		out := &msg{jobID: string(buf[2 : 2+n]), accepted: buf[2+n] == 1}
		sink = out
	}
	_ = sink
}
