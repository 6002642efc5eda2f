package apiv1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/disbatch-go/disbatch/store"
)

func TestClusterLeases(t *testing.T) {
	e := setup(t)
	ctx := ctxT(t)
	var c Cluster
	e.want(200, "GET", "/api/v1/cluster", nil).decode(t, &c)
	require.Empty(t, c.Leases, "no lease was ever taken")
	require.NotEmpty(t, c.Time)

	_, err := e.st.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "projector", Owner: "n2", TTL: time.Minute})
	require.NoError(t, err)
	_, err = e.st.LeaseAcquire(ctx, store.LeaseAcquireParams{Name: "leader", Owner: "n1", TTL: time.Minute})
	require.NoError(t, err)
	e.want(200, "GET", "/api/v1/cluster", nil).decode(t, &c)
	require.Len(t, c.Leases, 2)
	require.Equal(t, "leader", c.Leases[0].Name)
	require.Equal(t, "n1", c.Leases[0].Owner)
	require.Equal(t, "projector", c.Leases[1].Name)
	require.Equal(t, "n2", c.Leases[1].Owner)
	require.InDelta(t, 60_000, c.Leases[1].ExpiresMS, 10_000)
	require.Positive(t, c.Leases[0].Epoch)
}
