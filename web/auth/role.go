package auth

import (
	"fmt"
	"strings"
)

// Role is what a principal may do. The roles are ordered: admin allows
// everything write allows, and write everything read allows.
//
// The zero Role is no role: it allows nothing and nothing needs it, so a
// policy that returns it by mistake denies instead of opening the door.
type Role int

const (
	// RoleRead may look: GET, HEAD and OPTIONS, and the read-only searches.
	RoleRead Role = iota + 1
	// RoleWrite may also change queues and tasks.
	RoleWrite
	// RoleAdmin may also change nodes and queue balancing.
	RoleAdmin
)

var roleNames = [...]string{RoleRead: "read", RoleWrite: "write", RoleAdmin: "admin"}

// Valid reports whether r is one of RoleRead, RoleWrite and RoleAdmin.
func (r Role) Valid() bool { return r >= RoleRead && r <= RoleAdmin }

// Allows reports whether a principal with role r may do what needs role
// need. An invalid role on either side allows nothing.
func (r Role) Allows(need Role) bool {
	return r.Valid() && need.Valid() && r >= need
}

// String returns "read", "write" or "admin", or "Role(n)" for an invalid role.
func (r Role) String() string {
	if !r.Valid() {
		return fmt.Sprintf("Role(%d)", int(r))
	}
	return roleNames[r]
}

// ParseRole parses "read", "write" or "admin" (any case).
func ParseRole(s string) (Role, error) {
	for r := RoleRead; r <= RoleAdmin; r++ {
		if strings.EqualFold(s, roleNames[r]) {
			return r, nil
		}
	}
	return 0, fmt.Errorf("unknown role %q: want read, write or admin", s)
}

// MarshalText encodes a valid role as its name.
func (r Role) MarshalText() ([]byte, error) {
	if !r.Valid() {
		return nil, fmt.Errorf("marshal role: invalid role %d", int(r))
	}
	return []byte(r.String()), nil
}

// UnmarshalText is ParseRole.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}
