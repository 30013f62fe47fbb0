package scheduler

import (
	"testing"
)

// A job's life through the states: queued, taken, running, stopped; at
// every step it is in one place, a taken or running job is never queued
// again by a resync or a readied job read twice, and an evaluation is
// busy while any of its jobs is held or being completed.
func TestJobStatesKeepOnePlace(t *testing.T) {
	js := newJobStates()
	must := func(step string) {
		t.Helper()
		if err := js.check(); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	j := queueJob("j1", 1, "p", "x86_64-linux")
	j.EvaluationID = "e1"
	if !js.enqueue(j) || js.enqueue(j) {
		t.Fatal("enqueue: new once, then already queued")
	}
	must("queued")
	if !js.known("j1") || js.taken("j1") || !js.busy("e1") {
		t.Fatal("a queued job is known, not taken, and keeps its evaluation busy")
	}

	if js.take("j1") != j {
		t.Fatal("take did not return the queued job")
	}
	must("taken")
	if js.enqueue(j) {
		t.Fatal("a job being claimed was queued again")
	}
	must("taken, then read again")

	js.unclaim(j, true) // the claim failed: back in the queue
	must("unclaimed")
	if js.queue.get("j1") == nil || js.taken("j1") {
		t.Fatal("a failed claim did not put the job back")
	}

	js.take("j1")
	a := &assignment{id: "a1", job: j, session: 7}
	js.run(a)
	must("running")
	if js.enqueue(j) || js.assignment("j1") != a || !js.busy("e1") {
		t.Fatal("a running job was queued again, lost its assignment or freed its evaluation")
	}
	if got := js.runningOn(7); len(got) != 1 || got[0] != a || len(js.runningOn(8)) != 0 {
		t.Fatalf("runningOn(7) = %v", got)
	}
	if js.stop(&assignment{id: "a0", job: j}) {
		t.Fatal("an older assignment stopped the running one")
	}

	js.beginCompleting("e1")
	if !js.stop(a) || js.known("j1") {
		t.Fatal("stop left the job held")
	}
	must("completing")
	if !js.busy("e1") {
		t.Fatal("an evaluation with a completion being recorded is not busy")
	}
	js.endCompleting("e1")
	must("completed")
	if js.busy("e1") || len(js.completing) != 0 {
		t.Fatal("the evaluation is still busy after its last completion")
	}

	// A claim lost to a race drops the job.
	js.enqueue(j)
	js.take("j1")
	js.unclaim(j, false)
	must("lost race")
	if js.known("j1") {
		t.Fatal("a job lost to a race is still held")
	}
}

// check finds a job in two places.
func TestJobStatesCheck(t *testing.T) {
	js := newJobStates()
	j := queueJob("j1", 1, "p", "x86_64-linux")
	js.queue.add(j)
	js.claiming["j1"] = true
	if js.check() == nil {
		t.Fatal("a job queued and being claimed passed the check")
	}
	delete(js.claiming, "j1")
	js.running["j1"] = &assignment{job: j}
	if js.check() == nil {
		t.Fatal("a job queued and running passed the check")
	}
	js.queue.remove("j1")
	js.running["j2"] = &assignment{job: j}
	if js.check() == nil {
		t.Fatal("an assignment under another job's ID passed the check")
	}
}
