package plugin

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/schema"
)

func answer(status schema.Status, stdout, stderr string) Plugin {
	return Func(func(context.Context, Task) Result { return Result{Status: status, Stdout: stdout, Stderr: stderr} })
}

func TestFunc(t *testing.T) {
	t.Parallel()
	var got Task
	p := Func(func(_ context.Context, tk Task) Result {
		got = tk
		return Result{Status: 7, Stdout: "o"}
	})
	res := p.Run(t.Context(), Task{Queue: "q"})
	require.Equal(t, Result{Status: 7, Stdout: "o"}, res)
	require.Equal(t, "q", got.Queue)
}

func TestRegistry(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	require.Empty(t, r.Names())
	_, ok := r.Lookup("x")
	require.False(t, ok)

	r.Register("zeta", answer(1, "zeta", ""))
	r.Register(DemoConstructor, Demo())
	r.Register("alpha", answer(1, "alpha", ""))
	require.Equal(t, []string{DemoConstructor, "alpha", "zeta"}, r.Names())

	p, ok := r.Lookup("zeta")
	require.True(t, ok)
	require.Equal(t, "zeta", p.Run(t.Context(), Task{}).Stdout)

	r.Register("zeta", answer(1, "replaced", ""))
	p, ok = r.Lookup("zeta")
	require.True(t, ok)
	require.Equal(t, "replaced", p.Run(t.Context(), Task{}).Stdout)
	require.Len(t, r.Names(), 3)

	require.Panics(t, func() { r.Register("nil", nil) })
	_, ok = r.Lookup("nil")
	require.False(t, ok)
}

func TestRegistryConcurrent(t *testing.T) {
	t.Parallel()
	r := NewRegistry()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 100 {
				name := fmt.Sprintf("p%d-%d", i, j)
				r.Register(name, answer(1, name, ""))
				p, ok := r.Lookup(name)
				if !ok || p.Run(context.Background(), Task{}).Stdout != name {
					t.Errorf("lookup of %s after register failed", name)
				}
				_ = r.Names()
			}
		})
	}
	wg.Wait()
	require.Len(t, r.Names(), 800)
}
