package auth

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoleOrdering(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		have, need Role
		allows     bool
	}{
		{RoleRead, RoleRead, true},
		{RoleRead, RoleWrite, false},
		{RoleRead, RoleAdmin, false},
		{RoleWrite, RoleRead, true},
		{RoleWrite, RoleWrite, true},
		{RoleWrite, RoleAdmin, false},
		{RoleAdmin, RoleRead, true},
		{RoleAdmin, RoleWrite, true},
		{RoleAdmin, RoleAdmin, true},
		{0, RoleRead, false},
		{RoleAdmin, 0, false},
		{RoleAdmin, 4, false},
		{4, RoleRead, false},
	} {
		require.Equal(t, tc.allows, tc.have.Allows(tc.need), "%v allows %v", tc.have, tc.need)
	}
}

func TestParseRole(t *testing.T) {
	t.Parallel()
	for _, r := range []Role{RoleRead, RoleWrite, RoleAdmin} {
		got, err := ParseRole(r.String())
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
	got, err := ParseRole("Admin")
	require.NoError(t, err)
	require.Equal(t, RoleAdmin, got)
	for _, bad := range []string{"", "root", "reader", " read"} {
		_, err := ParseRole(bad)
		require.ErrorContains(t, err, "want read, write or admin")
	}
	require.Equal(t, "Role(0)", Role(0).String())

	b, err := json.Marshal(map[string]Role{"role": RoleWrite})
	require.NoError(t, err)
	require.JSONEq(t, `{"role":"write"}`, string(b))
	var v struct{ Role Role }
	require.NoError(t, json.Unmarshal([]byte(`{"Role":"admin"}`), &v))
	require.Equal(t, RoleAdmin, v.Role)
	require.Error(t, json.Unmarshal([]byte(`{"Role":"boss"}`), &v))
	_, err = json.Marshal(Role(0))
	require.Error(t, err)
}
