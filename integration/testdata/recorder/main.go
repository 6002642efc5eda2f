// Command recorder is the fault suite's plugin (integration/fault_*_test.go):
// an external disbatchd plugin (--plugin NAME=PATH) that records every
// execution of a task.
//
// It reads the task as JSON on stdin, appends a "start" record to the file
// named by $FAULT_RECORDER_FILE, sleeps parameters.ms milliseconds, appends
// an "end" record, and answers {"status": 1, "stdout": "run=<run id>\n"}, so
// that the task document shows which execution finished it. With
// parameters.fail_until N it answers status 2 instead (same stdout) on the
// task's attempts 1 to N, so that a queue's retries send it back. Each record is
// one JSON line written with a single write(2) on an O_APPEND descriptor, so
// records of concurrent executions (of several nodes) never interleave:
//
//	{"ev":"start","task":"<hex>","node":"n1","run":"<run id>","attempt":1,"pid":123,"ms":50,"t":<unix ns>}
package main

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

type input struct {
	ID         string `json:"id"`
	Node       string `json:"node"`
	Attempt    int    `json:"attempt"`
	Parameters struct {
		MS        json.Number `json:"ms"`
		FailUntil int         `json:"fail_until"`
	} `json:"parameters"`
}

type record struct {
	Ev      string `json:"ev"`
	Task    string `json:"task"`
	Node    string `json:"node"`
	Run     string `json:"run"`
	Attempt int    `json:"attempt"`
	PID     int    `json:"pid"`
	MS      int64  `json:"ms"`
	T       int64  `json:"t"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "recorder:", err)
		os.Exit(3)
	}
}

func run() error {
	b, err := io.ReadAll(os.Stdin)
	if err != nil {
		return fmt.Errorf("read stdin: %w", err)
	}
	var in input
	if err := json.Unmarshal(b, &in); err != nil {
		return fmt.Errorf("decode the task: %w: %q", err, b)
	}
	ms, err := msOf(in.Parameters.MS)
	if err != nil {
		return err
	}
	path := os.Getenv("FAULT_RECORDER_FILE")
	if path == "" {
		return fmt.Errorf("FAULT_RECORDER_FILE is not set")
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	var id [8]byte
	_, _ = rand.Read(id[:])
	rec := record{Task: in.ID, Node: in.Node, Run: hex.EncodeToString(id[:]), Attempt: in.Attempt, PID: os.Getpid(), MS: ms}
	write := func(ev string) error {
		rec.Ev, rec.T = ev, time.Now().UnixNano()
		line, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		_, err = f.Write(append(line, '\n')) // one write: one whole line
		return err
	}
	if err := write("start"); err != nil {
		return fmt.Errorf("start record: %w", err)
	}
	time.Sleep(time.Duration(ms) * time.Millisecond)
	if err := write("end"); err != nil {
		return fmt.Errorf("end record: %w", err)
	}
	status := 1
	if in.Attempt <= in.Parameters.FailUntil {
		status = 2
	}
	ans, _ := json.Marshal(map[string]any{"status": status, "stdout": "run=" + rec.Run + "\n", "stderr": ""})
	_, err = os.Stdout.Write(append(ans, '\n'))
	return err
}

// msOf reads parameters.ms: an integer number of milliseconds, 0 if absent.
func msOf(n json.Number) (int64, error) {
	if n == "" {
		return 0, nil
	}
	ms, err := n.Int64()
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f < 0 {
			return 0, fmt.Errorf("parameters.ms is not a number of milliseconds: %s", n)
		}
		ms = int64(f)
	}
	if ms < 0 {
		return 0, fmt.Errorf("parameters.ms is negative: %d", ms)
	}
	return ms, nil
}
