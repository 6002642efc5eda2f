package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/cli"
	"github.com/disbatch-go/disbatch/schema"
	"github.com/disbatch-go/disbatch/store"
)

// WebSubmitReport is the web-submit group.
type WebSubmitReport struct {
	Tasks   int         `json:"tasks"`
	Repeats int         `json:"repeats"`
	Rows    []SubmitRow `json:"rows"`
	// Ratio is the POST's median tasks/s over the CLI's.
	Ratio float64 `json:"ratio"`
	// Inserted is what the queue held afterwards; Expected what it should.
	Inserted int64 `json:"inserted"`
	Expected int64 `json:"expected"`
}

// SubmitRow is one way of submitting.
type SubmitRow struct {
	How     string    `json:"how"`
	Seconds float64   `json:"median_seconds"`
	Rate    float64   `json:"median_tasks_per_s"`
	Rates   []float64 `json:"tasks_per_s"`
}

const (
	howPOST = "POST /api/v1/tasks, one request (request start to 201 read)"
	howCLI  = "disbatch task submit (cli.Run in-process: connect, parse JSON lines, 4 x 1000 inserts)"
)

// webSubmit times POST /api/v1/tasks and `disbatch task submit` of the
// same tasks into one queue, alternating.
func (e *env) webSubmit(ctx context.Context) (*WebSubmitReport, error) {
	db, drop := e.database("websubmit")
	defer drop()
	s := store.New(db, store.Options{})
	if err := s.IndexesEnsure(ctx); err != nil {
		return nil, err
	}
	q, err := newQueue(ctx, s, "submit", e.cfg.MaxThreads)
	if err != nil {
		return nil, err
	}
	n := e.cfg.SubmitTasks
	var body, lines bytes.Buffer
	fmt.Fprintf(&body, `{"queue":%q,"tasks":[`, q.ID.Hex())
	for i := range n {
		params := fmt.Sprintf(`{"commands":"a","user":"user%d@example.com","n":%d}`, i, i)
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(`{"params":` + params + `}`)
		lines.WriteString(params + "\n")
	}
	body.WriteString("]}")

	w, err := e.startWeb(ctx, db.Name(), false)
	if err != nil {
		return nil, err
	}
	defer w.stop()
	hc := httpClient(5 * time.Minute)
	defer hc.CloseIdleConnections()

	post := func() (time.Duration, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+"/api/v1/tasks", bytes.NewReader(body.Bytes()))
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, fmt.Errorf("POST /api/v1/tasks: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		took := time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("POST /api/v1/tasks: read the answer: %w", err)
		}
		if resp.StatusCode != http.StatusCreated {
			return 0, fmt.Errorf("POST /api/v1/tasks: %s: %.300s", resp.Status, b)
		}
		var out struct {
			IDs []string `json:"ids"`
		}
		if err := json.Unmarshal(b, &out); err != nil || len(out.IDs) != n {
			return 0, fmt.Errorf("POST /api/v1/tasks: %d ids in the answer, want %d (%v)", len(out.IDs), n, err)
		}
		return took, nil
	}
	submit := func() (time.Duration, error) {
		var out, errb strings.Builder
		start := time.Now()
		code := cli.Run(ctx, []string{"task", "submit", q.Name, "--mongo-uri", e.uri, "--database", db.Name()},
			cli.IO{In: bytes.NewReader(lines.Bytes()), Out: &out, Err: &errb, Getenv: func(string) string { return "" }})
		took := time.Since(start)
		if code != cli.ExitOK {
			return 0, fmt.Errorf("disbatch task submit: exit %d: %s", code, strings.TrimSpace(errb.String()))
		}
		return took, nil
	}

	// One of each first, not counted (connections, caches).
	if _, err := post(); err != nil {
		return nil, err
	}
	if _, err := submit(); err != nil {
		return nil, err
	}
	rep := &WebSubmitReport{Tasks: n, Repeats: e.cfg.SubmitRepeats, Expected: int64(2 * n * (e.cfg.SubmitRepeats + 1))}
	rows := []SubmitRow{{How: howPOST}, {How: howCLI}}
	var times [2][]float64
	for i := range e.cfg.SubmitRepeats {
		for j, do := range []func() (time.Duration, error){post, submit} {
			took, err := do()
			if err != nil {
				return nil, err
			}
			rows[j].Rates = append(rows[j].Rates, rate(n, took))
			times[j] = append(times[j], took.Seconds())
		}
		e.log.Info("web-submit", "round", i+1, "post_tasks_per_s", round(rows[0].Rates[i]), "cli_tasks_per_s", round(rows[1].Rates[i]))
	}
	for j := range rows {
		rows[j].Seconds, rows[j].Rate = median(times[j]), median(rows[j].Rates)
	}
	rep.Rows, rep.Ratio = rows, ratio(rows[0].Rate, rows[1].Rate)
	if rep.Inserted, err = db.Collection(schema.CollTasks).CountDocuments(ctx, bson.D{{Key: schema.TaskQueue, Value: q.ID}}); err != nil {
		return rep, fmt.Errorf("count the tasks submitted: %w", err)
	}
	return rep, nil
}
