package plugin

import (
	"context"
	"fmt"
	"slices"
)

// Detachable is a plugin that can run in a process other than the node's:
// Detached names it, and FromDetached builds it again there. The process
// plugins (exec, shell, external executables) are; Demo and Go plugins
// run only inside the node.
type Detachable interface {
	Plugin
	Detached() DetachedSpec
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
func FromDetached(d DetachedSpec) (Plugin, error) {
	switch d.Kind {
	case ExecConstructor:
		return Exec(), nil
	case ShellConstructor:
		return Shell(), nil
	case externalKind:
		if d.Path == "" {
			return nil, fmt.Errorf("external plugin without a path")
		}
		return External(d.Path, d.Args...), nil
	}
	return nil, fmt.Errorf("plugin kind %q cannot run detached", d.Kind)
}

type execPlugin struct{}

func (execPlugin) Run(ctx context.Context, t Task) Result { return runExec(ctx, t) }
func (execPlugin) Detached() DetachedSpec                 { return DetachedSpec{Kind: ExecConstructor} }

type shellPlugin struct{}

func (shellPlugin) Run(ctx context.Context, t Task) Result { return runShell(ctx, t) }
func (shellPlugin) Detached() DetachedSpec                 { return DetachedSpec{Kind: ShellConstructor} }

// Detached names e.
func (e *external) Detached() DetachedSpec {
	return DetachedSpec{Kind: externalKind, Path: e.path, Args: slices.Clone(e.args)}
}
