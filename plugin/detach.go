package plugin

import (
	"context"
	"fmt"
	"slices"

	"github.com/disbatch-go/disbatch/plugin/proc"
)

// Detachable is a plugin that can run in a process other than the node's:
// Detached names it, and FromDetached builds it again there. The process
// plugins (exec, shell, external executables) are; Demo and Go plugins
// run only inside the node.
//
// Running one detached is Prepare, the Command's Run in the other process
// (package proc), and Interpret, which gives the same Result as the
// plugin's own Run for the same run of the process.
type Detachable interface {
	Plugin
	Detached() DetachedSpec
	// Prepare is the process that runs t, or (nil Command) the result of
	// a task that cannot run: bad parameters.
	Prepare(t Task) (proc.Command, *Result)
	// Interpret is the result of a task whose process c ended with r.
	Interpret(c proc.Command, r proc.Result) Result
}

// DetachedSpec names a Detachable plugin.
type DetachedSpec struct {
	Kind string   // ExecConstructor, ShellConstructor or "external"
	Path string   // external: the executable
	Args []string // external: its arguments
}

// externalKind is DetachedSpec.Kind of an External plugin.
const externalKind = "external"

// FromDetached builds the plugin d names.
func FromDetached(d DetachedSpec) (Detachable, error) {
	switch d.Kind {
	case ExecConstructor:
		return execPlugin{}, nil
	case ShellConstructor:
		return shellPlugin{}, nil
	case externalKind:
		if d.Path == "" {
			return nil, fmt.Errorf("external plugin without a path")
		}
		return &external{path: d.Path, args: slices.Clone(d.Args)}, nil
	}
	return nil, fmt.Errorf("plugin kind %q cannot run detached", d.Kind)
}

// runDetachable runs d's process here.
func runDetachable(ctx context.Context, d Detachable, t Task) Result {
	c, bad := d.Prepare(t)
	if bad != nil {
		return *bad
	}
	return d.Interpret(c, c.Run(ctx))
}

type execPlugin struct{}

func (p execPlugin) Run(ctx context.Context, t Task) Result       { return runDetachable(ctx, p, t) }
func (execPlugin) Detached() DetachedSpec                         { return DetachedSpec{Kind: ExecConstructor} }
func (execPlugin) Prepare(t Task) (proc.Command, *Result)         { return prepareExec(t) }
func (execPlugin) Interpret(c proc.Command, r proc.Result) Result { return commandResult(c, r) }

type shellPlugin struct{}

func (p shellPlugin) Run(ctx context.Context, t Task) Result       { return runDetachable(ctx, p, t) }
func (shellPlugin) Detached() DetachedSpec                         { return DetachedSpec{Kind: ShellConstructor} }
func (shellPlugin) Prepare(t Task) (proc.Command, *Result)         { return prepareShell(t) }
func (shellPlugin) Interpret(c proc.Command, r proc.Result) Result { return commandResult(c, r) }

// Detached names e.
func (e *external) Detached() DetachedSpec {
	return DetachedSpec{Kind: externalKind, Path: e.path, Args: slices.Clone(e.args)}
}
