package schema

import "go.mongodb.org/mongo-driver/v2/bson"

// Config is a document of the config collection. Disbatch 4 keeps node
// settings there; this project reads:
//
//   - label: which config document a node uses (a node started with a label
//     reads the document with that label, otherwise the one marked
//     active: true; with neither it runs with no config document);
//   - activequeues: when non-empty, the node runs only these queues (ids as
//     hex strings, or names);
//   - ignorequeues: when activequeues is empty, the node runs every queue but
//     these;
//   - plugins: informational list of plugin names.
//
// Everything else (log4perl, task_runner, web_root, ...) belongs to the Perl
// tools and is left alone.
type Config struct {
	Label        string
	Active       bool
	ActiveQueues []string
	IgnoreQueues []string
	Plugins      []string

	Raw bson.Raw
}

// Config BSON field names.
const (
	ConfigLabel        = "label"
	ConfigActive       = "active"
	ConfigActiveQueues = "activequeues"
	ConfigIgnoreQueues = "ignorequeues"
	ConfigPlugins      = "plugins"
)

// DecodeConfig decodes a config document.
func DecodeConfig(raw bson.Raw) (Config, error) {
	r := newReader(CollConfig, raw)
	c := Config{
		Label:        r.str(false, ConfigLabel),
		ActiveQueues: r.strings(ConfigActiveQueues),
		IgnoreQueues: r.strings(ConfigIgnoreQueues),
		Plugins:      r.strings(ConfigPlugins),
		Raw:          raw,
	}
	if _, v, ok := r.lookup(ConfigActive); ok {
		switch v.Type {
		case bson.TypeBoolean:
			c.Active = v.Boolean()
		default:
			i, err := asInt(v, false)
			if err != nil {
				r.fail(ConfigActive, wantGot("a boolean", v))
			}
			c.Active = i != 0
		}
	}
	if r.err != nil {
		return Config{}, r.err
	}
	return c, nil
}
