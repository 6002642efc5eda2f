package auth

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRequiredRole(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		method, path string
		want         Role
	}{
		{http.MethodGet, "/queues", RoleRead},
		{http.MethodHead, "/queues", RoleRead},
		{http.MethodOptions, "/queues", RoleRead},
		{http.MethodGet, "/nodes", RoleRead},
		{http.MethodGet, "/nodes/node-1", RoleRead},
		{http.MethodGet, "/balance", RoleRead},
		{http.MethodGet, "/api/v1/nodes", RoleRead},
		{http.MethodPost, "/queues", RoleWrite},
		{http.MethodPost, "/queues/q1", RoleWrite},
		{http.MethodDelete, "/queues/q1", RoleWrite},
		{http.MethodPost, "/tasks/q1", RoleWrite},
		{http.MethodPost, "/tasks/q1/users", RoleWrite},
		{http.MethodPut, "/api/v1/queues/q1", RoleWrite},
		{http.MethodPatch, "/api/v1/queues/q1", RoleWrite},
		{http.MethodDelete, "/api/v1/tasks/t1", RoleWrite},
		{"PROPFIND", "/queues", RoleWrite},
		{http.MethodPost, "/tasks/search", RoleRead},
		{http.MethodPost, "/search-tasks-json", RoleRead},
		{http.MethodPut, "/tasks/search", RoleWrite},
		{http.MethodPost, "/nodes/node-1", RoleAdmin},
		{http.MethodPost, "/nodes", RoleAdmin},
		{http.MethodPost, "/nodes/", RoleAdmin},
		{http.MethodDelete, "/nodes/node-1", RoleAdmin},
		{http.MethodPatch, "/api/v1/nodes/node-1", RoleAdmin},
		{http.MethodPost, "/api/v1/nodes", RoleAdmin},
		{http.MethodPost, "/balance", RoleAdmin},
		{http.MethodPut, "/api/v1/balance", RoleAdmin},
		{http.MethodPost, "/queues/../nodes/node-1", RoleAdmin},
		{http.MethodPost, "//nodes//node-1", RoleAdmin},
		{http.MethodPost, "/queues/nodes", RoleWrite},
		{http.MethodPost, "/nodesx", RoleWrite},
		// Cleaned, these would be the read-only searches; 4.103's routes
		// match them as they are (a queue "search", a collection "/").
		{http.MethodPost, "/tasks/search//", RoleWrite},
		{http.MethodPost, "/tasks/search/", RoleWrite},
		{http.MethodPost, "/search-tasks-json//", RoleWrite},
	} {
		r := httptest.NewRequest(tc.method, "/", nil)
		r.URL.Path = tc.path
		require.Equal(t, tc.want, RequiredRole(r), "%s %s", tc.method, tc.path)
	}
}
