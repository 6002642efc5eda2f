package apiv1

import (
	"errors"
	"net/http"
	"time"

	"github.com/disbatch-go/disbatch/store"
)

// The leases GET /api/v1/cluster reports: the elected leader's (its
// sweeping duties) and the counter projector's. Their names are the
// node's and the projections package's; the API does not import them.
var clusterLeases = []string{"leader", "projector"}

// Lease is who holds one of the cluster's leases.
type Lease struct {
	Name      string `json:"name"`
	Owner     string `json:"owner"`
	Epoch     int64  `json:"epoch"`
	Expires   string `json:"expires"`
	ExpiresMS int64  `json:"expires_in_ms"`
}

// Cluster is the answer of GET /api/v1/cluster.
type Cluster struct {
	Time   string  `json:"time"`
	Leases []Lease `json:"leases"`
}

func (h *handler) cluster(w http.ResponseWriter, r *http.Request) error {
	now, err := h.st.ServerNow(r.Context())
	if err != nil {
		return err
	}
	out := Cluster{Time: now.UTC().Format(time.RFC3339Nano), Leases: []Lease{}}
	for _, name := range clusterLeases {
		l, err := h.st.LeaseGet(r.Context(), name)
		if errors.Is(err, store.ErrNotFound) {
			continue // never taken: no such duty ran yet
		}
		if err != nil {
			return err
		}
		out.Leases = append(out.Leases, Lease{
			Name: name, Owner: l.Owner, Epoch: l.Epoch,
			Expires: l.Expires.UTC().Format(time.RFC3339Nano), ExpiresMS: l.Expires.Sub(now).Milliseconds(),
		})
	}
	return writeJSON(w, http.StatusOK, out)
}
