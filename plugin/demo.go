package plugin

import (
	"context"
	"strings"

	"github.com/disbatch-go/disbatch/schema"
)

// DemoConstructor is the constructor name of the Demo plugin.
const DemoConstructor = "Disbatch::Plugin::Demo"

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

// Demo returns the Disbatch 4.103 demo plugin. parameters.commands is a
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
// Missing or non-string commands fail the task.
func Demo() Plugin { return Func(runDemo) }

func runDemo(_ context.Context, t Task) Result {
	const bad = "parameters.commands must be a string of command letters\n"
	params, err := parameters(t)
	if err != nil {
		return Result{Status: schema.StatusFailed, Stderr: bad + err.Error() + "\n"}
	}
	v, ok := param(params, "commands")
	if !ok {
		return Result{Status: schema.StatusFailed, Stderr: bad}
	}
	commands, ok := v.StringValueOK()
	if !ok {
		return Result{Status: schema.StatusFailed, Stderr: bad}
	}
	if commands == "*" {
		commands = "abc"
	}
	has := func(c byte) bool { return strings.IndexByte(commands, c) >= 0 }

	var stdout, stderr strings.Builder
	if has('a') {
		stdout.WriteString("This is command 'a' for apple.\n")
	}
	if has('b') {
		stderr.WriteString("This is command 'b' for banana.\n")
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
	if has('c') {
		stderr.WriteString("This is command 'c' for cry.\n")
		status = schema.StatusFailed
	}
	return Result{Status: status, Stdout: stdout.String(), Stderr: stderr.String()}
}
