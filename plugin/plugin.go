package plugin

import (
	"context"
	"slices"
	"sync"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/disbatch-go/disbatch/schema"
)

// Task is what a plugin is given.
type Task struct {
	ID          bson.ObjectID
	QueueID     bson.ObjectID
	Queue       string   // queue name
	Constructor string   // the queue's constructor (plugin name)
	Node        string   // the node running it
	Attempt     int      // this run's attempt: 1 for the first, one more for each that ended before (retries, reruns)
	Parameters  bson.Raw // the task's parameters object (may be nil: treat as {})
	Document    bson.Raw // the whole task document as read
	Config      bson.Raw // the queue's config object (nil: none; treat as {})
}

// Result is what a plugin answers. Status must be > 0 (finished).
type Result struct {
	Status schema.Status
	Stdout string
	Stderr string
	// Extra are more fields for the task document: exec and shell set
	// schema.TaskResult and schema.TaskMixedout. The store writes only
	// those two and drops any other key (store.TaskFinishParams.Extra).
	Extra bson.D
	// Output, when the task succeeds, is written to the task; an object
	// or a list of objects, it becomes tasks of the queue's then queue.
	Output bson.RawValue
}

// Plugin runs tasks. Run must return when ctx is done; Run (the package
// function) protects the node from plugins that do not.
type Plugin interface {
	Run(ctx context.Context, t Task) Result
}

// Func adapts a function to Plugin.
type Func func(ctx context.Context, t Task) Result

// Run calls f.
func (f Func) Run(ctx context.Context, t Task) Result { return f(ctx, t) }

// Registry maps constructor names to plugins; safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	plugins map[string]Plugin
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{plugins: make(map[string]Plugin)}
}

// Register maps constructor to p, replacing any earlier plugin of that name.
// It panics if p is nil.
func (r *Registry) Register(constructor string, p Plugin) {
	if p == nil {
		panic("plugin: Register of a nil plugin for " + constructor)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.plugins[constructor] = p
}

// Lookup returns the plugin registered for constructor.
func (r *Registry) Lookup(constructor string) (Plugin, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p, ok := r.plugins[constructor]
	return p, ok
}

// Names returns the registered constructor names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	names := make([]string, 0, len(r.plugins))
	for n := range r.plugins {
		names = append(names, n)
	}
	r.mu.RUnlock()
	slices.Sort(names)
	return names
}
