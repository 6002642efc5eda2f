package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/disbatch-go/disbatch/internal/mongotest"
)

// BenchmarkSubmit100k measures `disbatch task submit` of 100,000 tasks from
// a JSON-lines file, end to end (parse, validate, insert with majority).
func BenchmarkSubmit100k(b *testing.B) {
	const n = 100_000
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, `{"commands":"a","user":"user%d@example.com","n":%d}`+"\n", i, i)
	}
	file := filepath.Join(b.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(file, []byte(sb.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	db := mongotest.Database(b)
	e := &env{db: db, uri: mongotest.URI(b)}
	b.ResetTimer()
	var total time.Duration
	for i := range b.N {
		queue := fmt.Sprintf("bench%d", i)
		b.StopTimer()
		if r := e.exec("", "queue", "create", queue, "--constructor", "C"); r.code != 0 {
			b.Fatal(r.err)
		}
		b.StartTimer()
		start := time.Now()
		if r := e.exec("", "task", "submit", queue, file); r.code != 0 {
			b.Fatal(r.err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(n*b.N)/total.Seconds(), "tasks/s")
	b.ReportMetric(total.Seconds()/float64(b.N), "s/100k")
}
