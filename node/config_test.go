package node_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/claimer"
	"github.com/disbatch-go/disbatch/node"
	"github.com/disbatch-go/disbatch/store"
)

// TestClaimLingerDefaultsAndNone: a ClaimLinger of 0 is the default,
// NoClaimLinger stays none, and another negative one is refused.
func TestClaimLingerDefaultsAndNone(t *testing.T) {
	t.Parallel()
	var c node.Config
	err := c.Validate()
	require.Error(t, err, "no name, store or plugins")
	require.NotContains(t, err.Error(), "claim linger")
	require.Equal(t, node.DefaultClaimLinger, c.ClaimLinger)

	c = node.Config{ClaimLinger: node.NoClaimLinger}
	require.NotContains(t, c.Validate().Error(), "claim linger")
	require.Equal(t, node.NoClaimLinger, c.ClaimLinger)

	c = node.Config{ClaimLinger: -5 * time.Millisecond}
	require.ErrorContains(t, c.Validate(), "claim linger must not be negative")
	c = node.Config{ClaimLinger: claimer.MaxLinger + time.Millisecond}
	require.ErrorContains(t, c.Validate(), "claim linger must be at most")
	c = node.Config{ClaimLinger: claimer.MaxLinger}
	require.NotContains(t, c.Validate().Error(), "claim linger")
}

func TestWakeupListenersAreACountOrZero(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 3} {
		c := node.Config{WakeupListeners: n}
		require.NotContains(t, c.Validate().Error(), "wake-up listeners", "%d", n)
	}
	c := node.Config{WakeupListeners: -1}
	require.ErrorContains(t, c.Validate(), "wake-up listeners must be 0 (every node) or more")
}

// TestClaimBatchIsWithinTheStoresMost: 0 is the default, and a batch the
// store would refuse (or the claimer clamp without a word) is refused.
func TestClaimBatchIsWithinTheStoresMost(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 64, store.MaxClaimBatch} {
		c := node.Config{ClaimBatch: n}
		require.NotContains(t, c.Validate().Error(), "claim batch", "%d", n)
	}
	for _, n := range []int{-1, store.MaxClaimBatch + 1} {
		c := node.Config{ClaimBatch: n}
		require.ErrorContains(t, c.Validate(), "claim batch must be 0 (the default) to 256", "%d", n)
	}
}
