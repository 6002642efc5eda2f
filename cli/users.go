package cli

import (
	"bufio"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/disbatch-go/disbatch/store"
)

func newUsersCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "users",
		Short: "Make the MongoDB roles and users of each program, least privilege each",
		Args:  groupArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newUsersCreate(g))
	return cmd
}

func newUsersCreate(g *globals) *cobra.Command {
	var names []string
	for _, r := range store.Roles {
		names = append(names, fmt.Sprintf("  %-13s %s", r.Name, r.Program))
	}
	return &cobra.Command{
		Use:   "create",
		Short: "Create (or update) every program's role and the users named on stdin (Disbatch 4.103's disbatch-create-users)",
		Long: `Connect with a user that may manage users (--mongo-uri with an admin's
credentials), create or update one role per program in the Disbatch database
with only the actions that program needs, and create (or update the password
of) the users read from stdin, one per line:

  NAME PASSWORD

Each user gets the role of its name. The roles:

` + strings.Join(names, "\n") + `

Then run each program with its own user, authenticated on the Disbatch
database, e.g. disbatchd --mongo-uri 'mongodb://disbatchd:PASSWORD@HOST/?replicaSet=rs0&authSource=disbatch'.
The roles named as 4.103's (disbatchd, disbatch_web, plugin, task_runner,
queuebalance) grant what both 4.103's program and ours need, so a mixed
site shares them.`,
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			type user struct{ name, password string }
			var users []user
			sc := bufio.NewScanner(cmd.InOrStdin())
			for line := 1; sc.Scan(); line++ {
				text := strings.TrimSpace(sc.Text())
				if text == "" || strings.HasPrefix(text, "#") {
					continue
				}
				name, password, ok := strings.Cut(text, " ")
				password = strings.TrimSpace(password)
				if !ok || password == "" {
					return usagef("stdin line %d: want NAME PASSWORD", line)
				}
				if !slices.ContainsFunc(store.Roles, func(r store.Role) bool { return r.Name == name }) {
					return usagef("stdin line %d: %q is no program's role (see --help)", line, name)
				}
				users = append(users, user{name, password})
			}
			if err := sc.Err(); err != nil {
				return err
			}
			s, done, err := g.open(cmd)
			if err != nil {
				return err
			}
			defer done()
			for _, r := range store.Roles {
				if err := s.RoleEnsure(cmd.Context(), r); err != nil {
					return err
				}
				fmt.Fprintf(g.io.Out, "role %s: %s\n", r.Name, r.Program)
			}
			for _, u := range users {
				if err := s.UserEnsure(cmd.Context(), u.name, u.password, u.name); err != nil {
					return err
				}
				fmt.Fprintf(g.io.Out, "user %s (role %s)\n", u.name, u.name)
			}
			return nil
		},
	}
}
