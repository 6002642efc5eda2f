package store

import (
	"context"
	"errors"
	"fmt"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/disbatch-go/disbatch/schema"
)

// Privilege is actions on one collection of the Disbatch database ("":
// every collection of it).
type Privilege struct {
	Collection string
	Actions    []string
}

// Role is a MongoDB role of one program, in the Disbatch database, as
// `disbatch users create` makes it (Disbatch 4.103's disbatch-create-users
// made the first five; ours grant what both kinds of program need).
type Role struct {
	Name       string
	Program    string
	Privileges []Privilege
}

var (
	readEverything = Privilege{"", []string{"find", "listIndexes", "listCollections", "changeStream"}}
	// Roles are the programs' roles, least privilege each.
	Roles = []Role{
		{Name: "disbatchd", Program: "the node (disbatchd, ours and 4.103's)", Privileges: []Privilege{
			readEverything,
			{schema.CollTasks, []string{"insert", "update", "createIndex", "collMod"}},
			{schema.CollQueues, []string{"update", "createIndex"}},
			{schema.CollNodes, []string{"insert", "update", "createIndex"}},
			{schema.CollTasksFiles, []string{"insert", "remove", "createIndex"}},
			{schema.CollTasksChunks, []string{"insert", "remove", "createIndex"}},
			{CollLeases, []string{"insert", "update", "remove"}},
			{CollStreams, []string{"insert", "update"}},
			{CollSessions, []string{"insert", "update", "remove", "createIndex"}},
			{CollBalance, []string{"update"}},        // the leader's QueueBalance status
			{schema.CollReports, []string{"insert"}}, // the built-in Demo plugin's reports
		}},
		{Name: "disbatch_web", Program: "the web server (disbatch-web, ours and 4.103's)", Privileges: operator},
		{Name: "disbatch_cli", Program: "the operator CLI (disbatch)", Privileges: operator},
		{Name: "plugin", Program: "plugins (4.103's Demo writes reports)", Privileges: []Privilege{
			{schema.CollReports, []string{"insert"}},
		}},
		{Name: "task_runner", Program: "4.103's task_runner", Privileges: []Privilege{
			{"", []string{"find"}},
			{schema.CollQueues, []string{"update"}},
			{schema.CollTasks, []string{"update"}},
			{schema.CollTasksChunks, []string{"insert"}},
			{schema.CollTasksFiles, []string{"insert"}},
		}},
		{Name: "queuebalance", Program: "4.103's queuebalanced", Privileges: []Privilege{
			{CollBalance, []string{"find", "insert", "update"}},
			{schema.CollQueues, []string{"find", "update"}},
			{schema.CollTasks, []string{"find"}},
		}},
	}
	// operator is what the web server and the CLI do: queues, tasks and
	// their control, nodes' maxthreads and drain, the balance document.
	operator = []Privilege{
		readEverything,
		{schema.CollQueues, []string{"insert", "update", "remove", "createIndex"}},
		{schema.CollTasks, []string{"insert", "update", "remove"}},
		{schema.CollTasksFiles, []string{"remove"}},
		{schema.CollTasksChunks, []string{"remove"}},
		{schema.CollNodes, []string{"update"}},
		{CollBalance, []string{"insert", "update"}},
	}
)

// RoleEnsure creates role r in the Disbatch database, or updates its
// privileges when it exists.
func (s *Store) RoleEnsure(ctx context.Context, r Role) error {
	privs := bson.A{}
	for _, p := range r.Privileges {
		privs = append(privs, bson.D{
			{Key: "resource", Value: bson.D{{Key: "db", Value: s.db.Name()}, {Key: "collection", Value: p.Collection}}},
			{Key: "actions", Value: p.Actions},
		})
	}
	err := s.db.RunCommand(ctx, bson.D{{Key: "createRole", Value: r.Name}, {Key: "privileges", Value: privs}, {Key: "roles", Value: bson.A{}}}).Err()
	if isCode(err, 51002) { // RoleAlreadyExists (Location51002)
		err = s.db.RunCommand(ctx, bson.D{{Key: "updateRole", Value: r.Name}, {Key: "privileges", Value: privs}, {Key: "roles", Value: bson.A{}}}).Err()
	}
	if err != nil {
		return fmt.Errorf("role %s: %w", r.Name, err)
	}
	return nil
}

// UserEnsure creates user name with password and role (a role of the
// Disbatch database), or sets both when the user exists.
func (s *Store) UserEnsure(ctx context.Context, name, password, role string) error {
	roles := bson.A{bson.D{{Key: "role", Value: role}, {Key: "db", Value: s.db.Name()}}}
	err := s.db.RunCommand(ctx, bson.D{{Key: "createUser", Value: name}, {Key: "pwd", Value: password}, {Key: "roles", Value: roles}}).Err()
	if isCode(err, 51003) { // UserAlreadyExists (Location51003)
		err = s.db.RunCommand(ctx, bson.D{{Key: "updateUser", Value: name}, {Key: "pwd", Value: password}, {Key: "roles", Value: roles}}).Err()
	}
	if err != nil {
		return fmt.Errorf("user %s: %w", name, err)
	}
	return nil
}

func isCode(err error, code int) bool {
	var se mongo.ServerError
	return err != nil && errors.As(err, &se) && se.HasErrorCode(code)
}
