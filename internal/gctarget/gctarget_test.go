package gctarget

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// current reads the collector's target (SetGCPercent returns the one it
// replaces; it is put back at once).
func current() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}

func TestApplySetsThePercentUnlessGOGCIsSet(t *testing.T) {
	before := current()
	t.Cleanup(func() { debug.SetGCPercent(before) })
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }

	debug.SetGCPercent(100)
	p, fromEnv := Apply(getenv)
	require.Equal(t, Percent, p)
	require.False(t, fromEnv)
	require.Equal(t, Percent, current(), "no GOGC: the node's target is set")

	for v, want := range map[string]int{"50": 50, "off": -1, "400": 400, "-5": -1} {
		debug.SetGCPercent(77) // stands for what the runtime took from GOGC
		env[EnvGOGC] = v
		p, fromEnv = Apply(getenv)
		require.Equal(t, want, p, "GOGC=%q", v)
		require.True(t, fromEnv)
		require.Equal(t, 77, current(), "GOGC=%q: the environment's target is left alone", v)
	}

	for _, v := range []string{" 300 ", "3000000000", "OFF"} {
		debug.SetGCPercent(100) // what the runtime makes of it
		env[EnvGOGC] = v
		p, fromEnv = Apply(getenv)
		require.Equal(t, Percent, p, "GOGC=%q: one the runtime cannot read is no GOGC", v)
		require.Equal(t, Percent, current())
		require.False(t, fromEnv)
	}
}
