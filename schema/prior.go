package schema

import (
	"fmt"
	"strconv"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Prior is a task's queue, status and (when the writer knew it) node
// before one of this project's writes, as TaskPrior holds it.
type Prior struct {
	Queue  bson.ObjectID
	Status Status
	// Node is empty when the writer did not know it (a claim matches
	// node -1 and null alike).
	Node string
}

// String is p as TaskPrior holds it, with a fresh id.
func (p Prior) String() string {
	s := p.Queue.Hex() + " " + strconv.Itoa(int(p.Status)) + " " + bson.NewObjectID().Hex()
	if p.Node != "" {
		s += " " + p.Node
	}
	return s
}

// ParsePrior reads a TaskPrior value.
func ParsePrior(s string) (Prior, error) {
	parts := strings.SplitN(s, " ", 4)
	if len(parts) < 3 {
		return Prior{}, fmt.Errorf("prior %q: want \"<queue> <status> <id>[ <node>]\"", s)
	}
	q, err := bson.ObjectIDFromHex(parts[0])
	if err != nil {
		return Prior{}, fmt.Errorf("prior %q: queue: %w", s, err)
	}
	st, err := strconv.Atoi(parts[1])
	if err != nil {
		return Prior{}, fmt.Errorf("prior %q: status: %w", s, err)
	}
	p := Prior{Queue: q, Status: Status(st)}
	if len(parts) == 4 {
		p.Node = parts[3]
	}
	return p, nil
}
