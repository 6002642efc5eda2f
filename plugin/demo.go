package plugin

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// DemoConstructor is the constructor name of the Demo plugin.
const DemoConstructor = "Disbatch::Plugin::Demo"

// DemoVersion is the version Demo writes in its reports, as 4.103's CPAN
// build does.
const DemoVersion = "4.103"

const mib = 1 << 20

// demoBulk are the Demo commands that write a lot, in the order they are
// checked: the letter, whether it writes to stderr, and how many MiB of the
// letter it writes.
var demoBulk = []struct {
	letter byte
	stderr bool
	mib    int
}{
	{'1', false, 1}, {'7', false, 7}, {'8', false, 8}, {'e', false, 15},
	{'A', true, 1}, {'B', true, 7}, {'C', true, 8}, {'E', true, 15},
}

// ReportWriter stores Demo's reports (store.Store.ReportInsert: the
// collection reports, as 4.103's Demo writes them).
type ReportWriter interface {
	ReportInsert(ctx context.Context, doc bson.D) error
}

// DemoPlugin is Disbatch 4.103's demo plugin. parameters.commands is a
// string of command letters ("*" means "abc"); each letter it contains acts
// once, in this order, whatever their order in the string:
//
//	a  stdout "This is command 'a' for apple.\n"
//	b  stderr "This is command 'b' for banana.\n"
//	1 7 8 e  stdout: that character repeated 1, 7, 8, 15 MiB
//	A B C E  stderr: that character repeated 1, 7, 8, 15 MiB
//	c  stderr "This is command 'c' for cry.\n" and fail (status 2)
//
// Without c the task succeeds (status 1); other characters are ignored.
// As 4.103's Demo: missing or null commands do nothing (status 1, no
// output); a number is read as the digits Perl prints (17: 1 and 7), true
// as "1", false as ""; a list or an object as Perl's "ARRAY(0x...)" or
// "HASH(0x...)", whose A writes 1 MiB of stderr (4.103's address digits
// may match more letters, at random; here the address is left out); a
// string parameters.stdout or stderr comes first in that output.
//
// With a ReportWriter (SetReports), each task also inserts a report into
// the collection reports unless parameters.noreport is true (Perl's
// truth): {counter, commands, task_id, queue_id, version, started,
// completed, errors, status: SUCCESS|FAILED, error}. A report that cannot
// be written fails the task ("Unable to complete"), as 4.103's
// task_runner does.
type DemoPlugin struct {
	reports atomic.Pointer[ReportWriter]
	now     func() time.Time
}

// Demo returns the Demo plugin, without reports until SetReports.
func Demo() *DemoPlugin { return &DemoPlugin{now: time.Now} }

// SetReports makes Demo write its reports with w (a node sets its store
// once connected).
func (d *DemoPlugin) SetReports(w ReportWriter) { d.reports.Store(&w) }

// Run runs one task.
func (d *DemoPlugin) Run(ctx context.Context, t Task) Result {
	started := d.now()
	params, err := parameters(t)
	if err != nil {
		return Result{Status: schema.StatusFailed, Stderr: "Demo: " + err.Error() + "\n"}
	}
	commandsValue, hasCommands := param(params, "commands")
	commands := perlString(commandsValue, hasCommands)
	if commands == "*" {
		commands = "abc"
	}
	has := func(c byte) bool { return strings.IndexByte(commands, c) >= 0 }

	var stdout, stderr strings.Builder
	if v, ok := param(params, "stdout"); ok {
		stdout.WriteString(perlString(v, true))
	}
	if v, ok := param(params, "stderr"); ok {
		stderr.WriteString(perlString(v, true))
	}
	nErrors := 0
	if has('a') {
		stdout.WriteString("This is command 'a' for apple.\n")
	}
	if has('b') {
		stderr.WriteString("This is command 'b' for banana.\n")
		nErrors++
	}
	for _, b := range demoBulk {
		if !has(b.letter) {
			continue
		}
		w := &stdout
		if b.stderr {
			w = &stderr
		}
		w.WriteString(strings.Repeat(string(b.letter), b.mib*mib))
	}
	status := schema.StatusSucceeded
	const cry = "This is command 'c' for cry.\n"
	if has('c') {
		stderr.WriteString(cry)
		status = schema.StatusFailed
		nErrors++
	}
	res := Result{Status: status, Stdout: stdout.String(), Stderr: stderr.String()}

	w := d.reports.Load()
	if v, ok := param(params, "noreport"); w == nil || (ok && perlTrue(v)) {
		return res
	}
	counter := bson.RawValue{Type: bson.TypeNull}
	if v, err := params.LookupErr("counter"); err == nil {
		counter = v
	}
	cmds := bson.RawValue{Type: bson.TypeNull}
	if hasCommands {
		cmds = commandsValue
	}
	report := bson.D{{Key: "counter", Value: counter}, {Key: "commands", Value: cmds},
		{Key: "task_id", Value: t.ID}, {Key: "queue_id", Value: t.QueueID}, {Key: "version", Value: DemoVersion},
		{Key: "started", Value: started.Unix()}, {Key: "completed", Value: d.now().Unix()}, {Key: "errors", Value: nErrors}}
	if status == schema.StatusSucceeded {
		report = append(report, bson.E{Key: "status", Value: "SUCCESS"})
	} else {
		report = append(report, bson.E{Key: "status", Value: "FAILED"}, bson.E{Key: "error", Value: "Task failed: " + cry})
	}
	if err := (*w).ReportInsert(ctx, report); err != nil {
		return Result{Status: schema.StatusFailed, Stdout: res.Stdout, Stderr: res.Stderr + "Unable to complete: writing the report: " + err.Error() + "\n"}
	}
	return res
}

// perlString is v as Perl interpolates it into a string.
func perlString(v bson.RawValue, ok bool) string {
	if !ok {
		return ""
	}
	switch v.Type {
	case bson.TypeString:
		return v.StringValue()
	case bson.TypeInt32, bson.TypeInt64:
		return strconv.FormatInt(v.AsInt64(), 10)
	case bson.TypeDouble:
		return strconv.FormatFloat(v.Double(), 'g', 15, 64)
	case bson.TypeBoolean:
		if v.Boolean() {
			return "1"
		}
		return ""
	case bson.TypeArray:
		return "ARRAY(0x)"
	case bson.TypeEmbeddedDocument:
		return "HASH(0x)"
	}
	return v.String()
}

// perlTrue is Perl's truth of a parameter: not "", "0", 0 or false.
func perlTrue(v bson.RawValue) bool {
	s := perlString(v, true)
	return s != "" && s != "0"
}
