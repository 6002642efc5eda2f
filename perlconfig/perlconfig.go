// Package perlconfig reads Disbatch 4.103's configuration file
// (/etc/disbatch/config.json), so that an operator who replaces 4.103's
// disbatchd or web server with ours keeps the file: `disbatchd
// --perl-config FILE`, `disbatch-web --perl-config FILE`.
//
// The file is JSON as 4.103 reads it (Cpanel::JSON::XS relaxed): `#`
// comments to the end of a line and trailing commas are allowed. What each
// key becomes here:
//
//	mongohost, database   the MongoDB URI (a host list gets mongodb://) and database
//	auth.<user>           the password of the program's user (disbatchd, disbatch_web),
//	                      authenticated on the database, as 4.103 connects
//	attributes.ssl        TLS: 1 or true, or {SSL_ca_file, SSL_verify_mode: 0,
//	                      SSL_cert_file + SSL_key_file in one PEM}
//	activequeues,
//	ignorequeues          the node's queue filter (ids or names), over the config collection's
//	gfs                   "auto" (GridFS above 15 MiB), false/0 (never), any other true value (always)
//	task_runner           where 4.103's task_runner is (for Perl plugins)
//	plugins, web_root,
//	monitoring, balance   disbatch-web's GET /plugins, static root, /monitoring, /balance
//	web_extensions        reported: they are Perl modules, which the Go server cannot load
//	log4perl, quiet,
//	testing, views_dir    reported as not used (logs are log/slog's; the views are built in)
//
// Any other key is reported as unknown, never fatal.
package perlconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Program names the user a program connects as (auth.<user>).
type Program string

// The programs of 4.103 whose users this project's binaries take.
const (
	Node Program = "disbatchd"
	Web  Program = "disbatch_web"
)

// GFS is how task output goes to GridFS.
type GFS string

// The gfs modes.
const (
	GFSAuto   GFS = "auto"   // above 15 MiB of stdout and stderr together
	GFSAlways GFS = "always" // every output
	GFSNever  GFS = "never"  // none
)

// Config is what the file says, for one program.
type Config struct {
	MongoURI      string // with the program's credentials and TLS options
	Database      string
	ActiveQueues  []string
	IgnoreQueues  []string
	GFS           GFS
	TaskRunner    string
	Plugins       []string
	WebRoot       string
	Monitoring    bool
	Balance       map[string]any
	WebExtensions map[string]any
	// Unknown are keys 4.103 does not read either; Unused are 4.103's
	// keys that mean nothing here (each with why). Report both.
	Unknown []string
	Unused  []string
}

// known are the keys 4.103 reads; unused says why one means nothing here.
var (
	known = []string{"mongohost", "database", "attributes", "auth", "plugins", "activequeues", "ignorequeues", "gfs",
		"task_runner", "quiet", "testing", "log4perl", "web_root", "views_dir", "web_extensions", "monitoring", "balance"}
	unused = map[string]string{
		"quiet":     "quiet: task output is never echoed to the node's log here",
		"testing":   "testing: 4.103's own test switch",
		"log4perl":  "log4perl: logs are --log-format/--log-level (log/slog)",
		"views_dir": "views_dir: the pages are built into disbatch-web",
	}
)

// Load reads the file at path for program p.
func Load(path string, p Program) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	return Parse(b, p)
}

// Parse reads the file's bytes for program p.
func Parse(b []byte, p Program) (Config, error) {
	var raw map[string]any
	dec := json.NewDecoder(bytes.NewReader(Relax(b)))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return Config{}, fmt.Errorf("not a 4.103 config (relaxed JSON object): %w", err)
	}
	var c Config
	for k := range raw {
		switch {
		case !slices.Contains(known, k):
			c.Unknown = append(c.Unknown, k)
		case unused[k] != "":
			c.Unused = append(c.Unused, unused[k])
		}
	}
	sort.Strings(c.Unknown)
	sort.Strings(c.Unused)
	host, _ := raw["mongohost"].(string)
	c.Database, _ = raw["database"].(string)
	if host == "" || c.Database == "" {
		return c, errors.New("mongohost and database are required, as 4.103 requires them")
	}
	uri, notes, err := mongoURI(host, c.Database, raw, p)
	if err != nil {
		return c, err
	}
	c.Unused = append(c.Unused, notes...)
	c.MongoURI = uri
	if c.ActiveQueues, err = stringList(raw, "activequeues"); err != nil {
		return c, err
	}
	if c.IgnoreQueues, err = stringList(raw, "ignorequeues"); err != nil {
		return c, err
	}
	if c.Plugins, err = stringList(raw, "plugins"); err != nil {
		return c, err
	}
	c.GFS = GFSAuto
	switch v := raw["gfs"].(type) {
	case nil:
	case string:
		switch v {
		case "auto":
		case "", "0":
			c.GFS = GFSNever
		default:
			c.GFS = GFSAlways
		}
	case bool:
		if !v {
			c.GFS = GFSNever
		} else {
			c.GFS = GFSAlways
		}
	case json.Number:
		if !Truthy(v) {
			c.GFS = GFSNever
		} else {
			c.GFS = GFSAlways
		}
	default:
		return c, fmt.Errorf("gfs: want \"auto\", true or false, got %v", v)
	}
	c.TaskRunner = "/usr/bin/task_runner"
	if v, ok := raw["task_runner"].(string); ok && v != "" {
		c.TaskRunner = v
	}
	c.WebRoot = "/etc/disbatch/htdocs/"
	if v, ok := raw["web_root"].(string); ok && v != "" {
		c.WebRoot = v
	}
	c.Monitoring = Truthy(raw["monitoring"])
	c.Balance, _ = raw["balance"].(map[string]any)
	c.WebExtensions, _ = raw["web_extensions"].(map[string]any)
	return c, nil
}

func stringList(raw map[string]any, key string) ([]string, error) {
	v, ok := raw[key]
	if !ok || v == nil {
		return nil, nil
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%s: want a list of strings, got %v", key, v)
	}
	out := make([]string, 0, len(list))
	for _, e := range list {
		s, ok := e.(string)
		if !ok {
			return nil, fmt.Errorf("%s: want strings, got %v", key, e)
		}
		out = append(out, s)
	}
	return out, nil
}

// Truthy is Perl's truth of a value of the file (decoded with json.Number):
// null, false, "", "0" and 0 are false.
func Truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != "" && x != "0"
	case json.Number:
		// A JSON number is a number to Perl: 0.0 and 0e0 are false too.
		f, err := x.Float64()
		return err != nil || f != 0
	}
	return true
}

// attrOptions are the attributes 4.103 hands MongoDB->connect that have
// a connection string option of the same meaning.
var attrOptions = map[string]string{
	"replica_set_name":            "replicaSet",
	"auth_mechanism":              "authMechanism",
	"connect_timeout_ms":          "connectTimeoutMS",
	"socket_timeout_ms":           "socketTimeoutMS",
	"server_selection_timeout_ms": "serverSelectionTimeoutMS",
	"heartbeat_frequency_ms":      "heartbeatFrequencyMS",
	"local_threshold_ms":          "localThresholdMS",
	"max_pool_size":               "maxPoolSize",
	"app_name":                    "appName",
	"compressors":                 "compressors",
}

// attrValue is an attribute's value as its connection string option
// takes it, or why it is not followed: timeouts and sizes are whole
// numbers of 0 or more (Perl's driver reads a negative timeout as none;
// the option has no such value), names are strings; compressors a list.
func attrValue(k string, v any) (string, string) {
	switch k {
	case "replica_set_name", "auth_mechanism", "app_name":
		if s, ok := v.(string); ok && s != "" {
			return s, ""
		}
		return "", fmt.Sprintf("%v is not a name: not followed", v)
	case "compressors":
		var names []string
		switch x := v.(type) {
		case string:
			names = []string{x}
		case []any:
			for _, e := range x {
				s, ok := e.(string)
				if !ok {
					return "", fmt.Sprintf("%v is not a list of names: not followed", v)
				}
				names = append(names, s)
			}
		default:
			return "", fmt.Sprintf("%v is not a list of names: not followed", v)
		}
		return strings.Join(names, ","), ""
	}
	n, ok := v.(json.Number)
	if !ok {
		return "", fmt.Sprintf("%v is not a number: not followed", v)
	}
	i, err := n.Int64()
	if err != nil || i < 0 {
		return "", fmt.Sprintf("%v: not followed (a whole number of 0 or more here; a negative timeout, none in Perl's driver, is the default here)", n)
	}
	return strconv.FormatInt(i, 10), ""
}

// attrIgnored are attributes that would change what these programs rely
// on, with why they are not followed.
var attrIgnored = map[string]string{
	"w":                  "attributes.w: these programs write with the write concern each write needs (majority where a failover must not lose it)",
	"j":                  "attributes.j: these programs write with the write concern each write needs",
	"wtimeout":           "attributes.wtimeout: these programs bound each write by its own deadline",
	"read_preference":    "attributes.read_preference: these programs read from the primary",
	"read_concern_level": "attributes.read_concern_level: these programs choose each read's concern",
}

// mongoURI builds the connection string 4.103 would connect with, from
// mongohost, the program's auth user and the attributes 4.103 hands
// MongoDB->connect; notes say which attributes are not followed, and why.
func mongoURI(host, db string, raw map[string]any, p Program) (string, []string, error) {
	if !strings.HasPrefix(host, "mongodb://") && !strings.HasPrefix(host, "mongodb+srv://") {
		host = "mongodb://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return "", nil, fmt.Errorf("mongohost: %w", err)
	}
	if u.Path == "" {
		u.Path = "/"
	}
	q := u.Query()
	if auth, ok := raw["auth"].(map[string]any); ok && len(auth) > 0 {
		pw, ok := auth[string(p)].(string)
		if !ok {
			return "", nil, fmt.Errorf("auth has no password for the user %s, which 4.103's %s connects as", p, p)
		}
		u.User = url.UserPassword(string(p), pw)
		q.Set("authSource", db)
	}
	var notes []string
	if attrs, ok := raw["attributes"].(map[string]any); ok {
		// Credentials in the attributes count only without an auth block:
		// 4.103 replaces them with auth's (username, password, db_name).
		if u.User == nil {
			user, _ := attrs["username"].(string)
			pw, hasPW := attrs["password"].(string)
			switch {
			case user != "" && hasPW:
				u.User = url.UserPassword(user, pw)
			case user != "":
				u.User = url.User(user)
			}
			if name, _ := attrs["db_name"].(string); name != "" {
				q.Set("authSource", name)
			}
		}
		keys := make([]string, 0, len(attrs))
		for k := range attrs {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			v := attrs[k]
			switch {
			case k == "ssl", k == "username", k == "password", k == "db_name":
			case attrOptions[k] != "":
				val, why := attrValue(k, v)
				switch {
				case why != "":
					notes = append(notes, "attributes."+k+": "+why)
				case q.Get(attrOptions[k]) != "":
					notes = append(notes, "attributes."+k+": mongohost's "+attrOptions[k]+" is kept")
				default:
					q.Set(attrOptions[k], val)
				}
			case attrIgnored[k] != "":
				notes = append(notes, attrIgnored[k])
			default:
				notes = append(notes, "attributes."+k+": no connection option here matches it (give it in a --mongo-uri instead)")
			}
		}
		switch ssl := attrs["ssl"].(type) {
		case nil:
		case map[string]any:
			q.Set("tls", "true")
			if ca, ok := ssl["SSL_ca_file"].(string); ok {
				q.Set("tlsCAFile", ca)
			}
			if mode, ok := ssl["SSL_verify_mode"]; ok && !Truthy(mode) {
				q.Set("tlsInsecure", "true")
			}
			cert, _ := ssl["SSL_cert_file"].(string)
			key, _ := ssl["SSL_key_file"].(string)
			switch {
			case cert != "" && (key == "" || key == cert):
				q.Set("tlsCertificateKeyFile", cert)
			case cert != "" || key != "":
				return "", nil, errors.New("attributes.ssl: SSL_cert_file and SSL_key_file must be one PEM file here (the Go driver reads both from tlsCertificateKeyFile)")
			}
		default:
			if Truthy(ssl) {
				q.Set("tls", "true")
			}
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), notes, nil
}

// Relax turns 4.103's relaxed JSON into JSON: # comments (outside strings)
// and commas before a closing bracket or brace are removed.
func Relax(b []byte) []byte {
	var out []byte
	inString, escaped := false, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		switch {
		case inString:
			out = append(out, c)
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
			out = append(out, c)
		case c == '#':
			for i < len(b) && b[i] != '\n' {
				i++
			}
			if i < len(b) {
				out = append(out, '\n')
			}
		case c == ']' || c == '}':
			// Drop a trailing comma (and what follows it is blank).
			j := len(out) - 1
			for j >= 0 && (out[j] == ' ' || out[j] == '\t' || out[j] == '\n' || out[j] == '\r') {
				j--
			}
			if j >= 0 && out[j] == ',' {
				out = append(out[:j], out[j+1:]...)
			}
			out = append(out, c)
		default:
			out = append(out, c)
		}
	}
	return out
}
