package wire

import (
	"reflect"
	"testing"
)

// The class and lane of every message, as the authority's dispatch, the
// hub and the session writer rely on them: a message that changes class or
// lane changes who handles it or what it may overtake.
func TestMessageClasses(t *testing.T) {
	const s, j, c = ClassSession, ClassJob, ClassCache
	client := map[string]struct {
		class MessageClass
		bulk  bool
	}{
		"InitConnection": {s, false}, "AuthResponse": {s, false}, "ReauthRequest": {s, false}, "Reject": {s, false},
		"HandoverDone":       {s, false},
		"WorkerCapabilities": {j, false}, "WorkerMetrics": {j, false}, "RequestJobList": {j, false},
		"RequestJobChunk": {j, false}, "AssignJobResponse": {j, false}, "JobUpdate": {j, false},
		"JobCompleted": {j, true}, "JobFailed": {j, true}, "Draining": {j, false}, "BuildProgress": {j, false},
		"EvalProgress": {j, false}, "LogChunk": {j, true}, "RequestJob": {j, false}, "ClusterSignal": {j, false},
		"EvalMessage": {j, false}, "ImportRequest": {j, false},
		"NarRequest": {c, false}, "NarRequestResume": {c, true}, "EvalCachePull": {c, false}, "CacheQuery": {c, false},
		"QueryKnownDerivations": {c, false}, "UploadRequest": {c, false}, "UploadChunk": {c, true},
		"UploadFinished": {c, false}, "UploadCancel": {c, false},
	}
	server := map[string]struct {
		class MessageClass
		bulk  bool
	}{
		"AuthChallenge": {s, false}, "InitAck": {s, false}, "AuthUpdate": {s, false}, "Reject": {s, false},
		"Error": {s, false}, "Draining": {s, false}, "Authenticate": {s, false}, "Handover": {s, false},
		"JobListChunk": {j, false}, "JobOffer": {j, false}, "AssignJob": {j, false}, "AbortJob": {j, false},
		"StartCluster": {j, false}, "ClusterSignal": {j, false}, "AbortCluster": {j, false},
		"Credential": {j, false}, "ImportResult": {j, false},
		"NarPush": {c, true}, "NarUnavailable": {c, true}, "NarAbort": {c, true}, "NarStreamHeader": {c, true},
		"EvalCachePullResult": {c, true}, "EvalCacheChunk": {c, true}, "CacheStatus": {c, false},
		"KnownDerivations": {c, false}, "CacheError": {c, false}, "UploadGrant": {c, false},
		"UploadCommitted": {c, false},
	}
	for _, dir := range []struct {
		enum reflect.Type
		want map[string]struct {
			class MessageClass
			bulk  bool
		}
		got func(m Message) (MessageClass, bool)
	}{
		{reflect.TypeFor[ClientMessage](), client, func(m Message) (MessageClass, bool) {
			return ClientMessageClass(m.(ClientMessage)), ClientMessageBulk(m.(ClientMessage))
		}},
		{reflect.TypeFor[ServerMessage](), server, func(m Message) (MessageClass, bool) {
			return ServerMessageClass(m.(ServerMessage)), ServerMessageBulk(m.(ServerMessage))
		}},
	} {
		info, ok := Enum(dir.enum)
		if !ok {
			t.Fatalf("%s: no enum info", dir.enum)
		}
		if len(info.Variants) != len(dir.want) {
			t.Errorf("%s: %d variants, the test knows %d", dir.enum, len(info.Variants), len(dir.want))
		}
		for _, v := range info.Variants {
			m := reflect.New(v.Type.Elem()).Interface().(Message)
			want, known := dir.want[v.Name]
			class, bulk := dir.got(m)
			if !known || class != want.class || bulk != want.bulk {
				t.Errorf("%s %s: class %d, bulk %t; want %+v (known %t)", dir.enum.Name(), v.Name, class, bulk, want, known)
			}
		}
	}
}
