package schema

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/x/bsonx/bsoncore"
)

// DecodeError says which document and field could not be understood.
type DecodeError struct {
	Collection string
	ID         string // the _id as MongoDB shell syntax, or "(no _id)"
	Field      string // empty when the document as a whole is unreadable
	Err        error
}

func (e *DecodeError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("%s document %s: %v", e.Collection, e.ID, e.Err)
	}
	return fmt.Sprintf("%s document %s: field %q: %v", e.Collection, e.ID, e.Field, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// reader walks one raw document and turns the first problem into a
// *DecodeError. After an error every accessor returns zero values, so a
// decoder can read all fields and check r.err once.
type reader struct {
	coll     string
	raw      bson.Raw
	id       string
	err      error
	warnings []string
	// fields are raw's top-level fields in order, read in one pass: a
	// decoder looks up some twenty names, most of them absent, and each
	// Raw.LookupErr walked the whole document again (9.6 µs a task read
	// back by a claim, 3.2 µs since: BenchmarkDecodeTask).
	fields []field
	buf    [24]field
}

// field is one top-level field of the document: where its key and value
// lie in it, and the value's type (small: a reader is made per document).
type field struct {
	key, val [2]uint32
	typ      bson.Type
}

func newReader(coll string, raw bson.Raw) *reader {
	r := &reader{coll: coll, raw: raw, id: "(no _id)"}
	if err := raw.Validate(); err != nil {
		r.err = &DecodeError{Collection: coll, ID: r.id, Err: fmt.Errorf("not a valid BSON document: %w", err)}
		return r
	}
	r.fields = r.buf[:0]
	at := uint32(4) // valid: a length, the elements, a 0
	for rest := raw[4 : len(raw)-1]; len(rest) > 0; {
		e, next, ok := bsoncore.ReadElement(rest)
		if !ok {
			// The document's final 0, when bytes follow it (Validate
			// lets bytes past the length by): never read past.
			break
		}
		key := uint32(len(e.KeyBytes()))
		end := at + uint32(len(e))
		r.fields = append(r.fields, field{key: [2]uint32{at + 1, at + 1 + key}, val: [2]uint32{at + 2 + key, end}, typ: bson.Type(e[0])})
		at, rest = end, next
	}
	if v, ok := r.field("_id"); ok {
		r.id = describe(v)
	}
	return r
}

// field is the value of the document's first field named name, as
// Raw.LookupErr would find it.
func (r *reader) field(name string) (bson.RawValue, bool) {
	for _, f := range r.fields {
		if string(r.raw[f.key[0]:f.key[1]]) == name {
			return bson.RawValue{Type: f.typ, Value: r.raw[f.val[0]:f.val[1]]}, true
		}
	}
	return bson.RawValue{}, false
}

func (r *reader) fail(field string, err error) {
	if r.err == nil {
		r.err = &DecodeError{Collection: r.coll, ID: r.id, Field: field, Err: err}
	}
}

func (r *reader) warn(format string, args ...any) {
	r.warnings = append(r.warnings, fmt.Sprintf(format, args...))
}

// lookup returns the value of the first of names that is present and not
// null, and which name it was.
func (r *reader) lookup(names ...string) (string, bson.RawValue, bool) {
	if r.err != nil {
		return "", bson.RawValue{}, false
	}
	for _, n := range names {
		v, ok := r.field(n)
		if ok && v.Type != bson.TypeNull && v.Type != bson.TypeUndefined {
			return n, v, true
		}
	}
	return "", bson.RawValue{}, false
}

func (r *reader) objectID(required bool, name string) bson.ObjectID {
	_, v, ok := r.lookup(name)
	if !ok {
		if required {
			r.fail(name, errMissing)
		}
		return bson.ObjectID{}
	}
	id, ok := v.ObjectIDOK()
	if !ok {
		r.fail(name, wantGot("an ObjectId", v))
	}
	return id
}

func (r *reader) str(required bool, names ...string) string {
	n, v, ok := r.lookup(names...)
	if !ok {
		if required {
			r.fail(names[0], errMissing)
		}
		return ""
	}
	s, ok := v.StringValueOK()
	if !ok {
		r.fail(n, wantGot("a string", v))
		return ""
	}
	if required && s == "" {
		r.fail(n, errors.New("empty string"))
	}
	return s
}

// count reads a non-negative integer or null.
func (r *reader) count(names ...string) *int64 {
	n, v, ok := r.lookup(names...)
	if !ok {
		return nil
	}
	i, err := asInt(v, false)
	if err == nil && i < 0 {
		err = fmt.Errorf("negative value %d", i)
	}
	if err != nil {
		r.fail(n, err)
		return nil
	}
	return &i
}

// counter reads a projected counter as a count (Count: a non-negative
// int32 or int64), or nil when missing, null or anything else. A counter is a
// projection, not an order, so a bad one never makes the queue malformed:
// its count is unknown, with a warning, until the projector's recount
// sets it (as it does any counter Counter refuses).
func (r *reader) counter(name string) *int64 {
	_, v, ok := r.lookup(name)
	if !ok {
		return nil
	}
	i, ok := Count(v)
	if !ok {
		r.warn("%s: want a non-negative integer counter, got %s: unknown until the counter projector recounts the queue", name, describe(v))
		return nil
	}
	return &i
}

// maxThreads reads a non-negative integer or null. Strings of digits are
// accepted because the Disbatch 4 web form may store them.
func (r *reader) maxThreads(names ...string) *int {
	n, v, ok := r.lookup(names...)
	if !ok {
		return nil
	}
	i, err := asInt(v, true)
	if err == nil && (i < 0 || i > MaxThreadsLimit) {
		err = fmt.Errorf("%d is out of range: want a non-negative integer or null", i)
	}
	if err != nil {
		r.fail(n, err)
		return nil
	}
	m := int(i)
	return &m
}

func (r *reader) strings(name string) []string {
	_, v, ok := r.lookup(name)
	if !ok {
		return nil
	}
	if s, ok := v.StringValueOK(); ok {
		return []string{s}
	}
	arr, ok := v.ArrayOK()
	if !ok {
		r.fail(name, wantGot("an array of strings", v))
		return nil
	}
	vals, err := arr.Values()
	if err != nil {
		r.fail(name, err)
		return nil
	}
	out := make([]string, 0, len(vals))
	for i, e := range vals {
		switch e.Type {
		case bson.TypeString:
			out = append(out, e.StringValue())
		case bson.TypeObjectID: // activequeues may hold queue ids
			out = append(out, e.ObjectID().Hex())
		default:
			r.fail(fmt.Sprintf("%s.%d", name, i), wantGot("a string", e))
			return nil
		}
	}
	return out
}

// flag reads a boolean; an operator typing in the mongo shell may write
// 1 or 0 instead, so integers are accepted as well.
func (r *reader) flag(name string) bool {
	_, v, ok := r.lookup(name)
	if !ok {
		return false
	}
	if b, ok := v.BooleanOK(); ok {
		return b
	}
	if i, err := asInt(v, false); err == nil {
		return i != 0
	}
	r.fail(name, wantGot("true or false", v))
	return false
}

// timeOf reads a date. Old Disbatch documents may hold epoch seconds.
func (r *reader) timeOf(name string) time.Time {
	_, v, ok := r.lookup(name)
	if !ok {
		return time.Time{}
	}
	switch v.Type {
	case bson.TypeDateTime:
		return v.Time().UTC()
	case bson.TypeTimestamp:
		t, _ := v.Timestamp()
		return time.Unix(int64(t), 0).UTC()
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble:
		f := v.AsFloat64()
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(frac*1e9)).UTC()
	case bson.TypeString:
		if t, err := time.Parse(time.RFC3339Nano, v.StringValue()); err == nil {
			return t.UTC()
		}
	}
	r.fail(name, wantGot("a date", v))
	return time.Time{}
}

var errMissing = errors.New("missing")

var digits = regexp.MustCompile(`^[0-9]{1,10}$`)

// asInt accepts int32, int64 and integral doubles (and, with digitStrings,
// strings of decimal digits).
func asInt(v bson.RawValue, digitStrings bool) (int64, error) {
	switch v.Type {
	case bson.TypeInt32:
		return int64(v.Int32()), nil
	case bson.TypeInt64:
		return v.Int64(), nil
	case bson.TypeDouble:
		f := v.Double()
		if f != math.Trunc(f) || math.IsInf(f, 0) || math.IsNaN(f) || math.Abs(f) > 1<<53 {
			return 0, fmt.Errorf("want an integer, got %v", f)
		}
		return int64(f), nil
	case bson.TypeString:
		if s := v.StringValue(); digitStrings && digits.MatchString(s) {
			return strconv.ParseInt(s, 10, 64)
		}
	}
	return 0, wantGot("an integer", v)
}

func wantGot(want string, v bson.RawValue) error {
	return fmt.Errorf("want %s, got %s", want, describe(v))
}

// Describe renders a value for an error message or a log line, short: its
// type and value ("string \"x\"", "32-bit integer 7", "array").
func Describe(v bson.RawValue) string { return describe(v) }

// describe renders a value for an error message, short.
func describe(v bson.RawValue) string {
	var s string
	switch v.Type {
	case bson.TypeObjectID:
		s = `ObjectId("` + v.ObjectID().Hex() + `")`
	case bson.TypeString:
		s = "string " + strconv.Quote(v.StringValue())
	case bson.TypeEmbeddedDocument:
		s = "object"
	case bson.TypeArray:
		s = "array"
	case bson.TypeNull:
		s = "null"
	case bson.TypeInt32: // plain numbers, not extended JSON
		s = v.Type.String() + " " + strconv.FormatInt(int64(v.Int32()), 10)
	case bson.TypeInt64:
		s = v.Type.String() + " " + strconv.FormatInt(v.Int64(), 10)
	case bson.TypeDouble:
		s = v.Type.String() + " " + strconv.FormatFloat(v.Double(), 'g', -1, 64)
	default:
		s = v.Type.String() + " " + v.String()
	}
	if len(s) > 80 {
		s = s[:77] + "..."
	}
	return s
}
