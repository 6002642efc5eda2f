package dci

import (
	"bytes"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Disbatch 4.103 answers with Perl's JSON encoder in canonical mode: keys
// sorted, no white space, non-ASCII as raw UTF-8, "/" not escaped; in pretty
// mode three-space indents, " : " between a key and its value and a final
// newline. Its clients (the CLI prints bodies raw) see exactly these bytes,
// so the values of this package are encoded by hand rather than by
// encoding/json (which escapes <, > and &, and indents otherwise).

// obj is a JSON object; its keys are written sorted.
type obj map[string]any

// oid is an ObjectId, written {"$oid":"<hex>"} as the Perl driver's TO_JSON does.
type oid bson.ObjectID

// number is a JSON number written as given (Perl keeps a number's text).
type number string

func encodeJSON(v any, pretty bool) []byte {
	var b bytes.Buffer
	e := encoder{b: &b, pretty: pretty}
	e.value(v, 0)
	if pretty {
		b.WriteByte('\n')
	}
	return b.Bytes()
}

type encoder struct {
	b      *bytes.Buffer
	pretty bool
}

func (e *encoder) indent(level int) {
	if e.pretty {
		e.b.WriteByte('\n')
		for range level {
			e.b.WriteString("   ")
		}
	}
}

func (e *encoder) value(v any, level int) {
	switch x := v.(type) {
	case nil:
		e.b.WriteString("null")
	case bool:
		if x {
			e.b.WriteString("true")
		} else {
			e.b.WriteString("false")
		}
	case string:
		e.str(x)
	case number:
		e.b.WriteString(string(x))
	case int:
		e.b.WriteString(strconv.Itoa(x))
	case int32:
		e.b.WriteString(strconv.FormatInt(int64(x), 10))
	case int64:
		e.b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		e.b.WriteString(perlFloat(x))
	case nv:
		e.b.WriteString(perlNV(float64(x)))
	case oid:
		e.value(obj{"$oid": bson.ObjectID(x).Hex()}, level)
	case []string:
		a := make([]any, len(x))
		for i, s := range x {
			a[i] = s
		}
		e.value(a, level)
	case []any:
		if len(x) == 0 {
			e.b.WriteString("[]")
			return
		}
		e.b.WriteByte('[')
		for i, el := range x {
			if i > 0 {
				e.b.WriteByte(',')
			}
			e.indent(level + 1)
			e.value(el, level+1)
		}
		e.indent(level)
		e.b.WriteByte(']')
	case obj:
		if len(x) == 0 {
			e.b.WriteString("{}")
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		e.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				e.b.WriteByte(',')
			}
			e.indent(level + 1)
			e.str(k)
			if e.pretty {
				e.b.WriteString(" : ")
			} else {
				e.b.WriteByte(':')
			}
			e.value(x[k], level+1)
		}
		e.indent(level)
		e.b.WriteByte('}')
	default:
		e.b.WriteString("null")
	}
}

const hexDigits = "0123456789abcdef"

func (e *encoder) str(s string) {
	e.b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				e.b.WriteString(`\"`)
			case '\\':
				e.b.WriteString(`\\`)
			case '\n':
				e.b.WriteString(`\n`)
			case '\r':
				e.b.WriteString(`\r`)
			case '\t':
				e.b.WriteString(`\t`)
			case '\b':
				e.b.WriteString(`\b`)
			case '\f':
				e.b.WriteString(`\f`)
			default:
				if c < 0x20 {
					e.b.WriteString(`\u00`)
					e.b.WriteByte(hexDigits[c>>4])
					e.b.WriteByte(hexDigits[c&0xf])
				} else {
					e.b.WriteByte(c)
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			e.b.WriteString(`\ufffd`)
		} else {
			e.b.WriteString(s[i : i+size])
		}
		i += size
	}
	e.b.WriteByte('"')
}

// perlFloat writes a float as Perl prints a number: integers without a
// fraction, others with up to 15 significant digits.
func perlFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return `"NaN"`
	case math.IsInf(f, 1):
		return `"inf"`
	case math.IsInf(f, -1):
		return `"-inf"`
	case f == math.Trunc(f) && math.Abs(f) < 1e15:
		return strconv.FormatFloat(f, 'f', -1, 64)
	}
	s := strconv.FormatFloat(f, 'g', 15, 64)
	// Perl's %.15g: trim trailing zeros of the mantissa.
	if mant, exp, ok := cutExp(s); ok {
		return trimZeros(mant) + exp
	}
	return trimZeros(s)
}

// nv is a BSON double as the Perl driver decodes it: a Perl NV, which
// Cpanel::JSON::XS writes with a ".0" when it is integral (5.0, -2.0), where
// a computed number (perlFloat) may be an integer.
type nv float64

// perlNV writes an NV as Cpanel::JSON::XS does: perlFloat, with ".0" kept
// on integral values below 1e15 (larger ones are in exponent form).
func perlNV(f float64) string {
	s := perlFloat(f)
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		s += ".0"
	}
	return s
}

func cutExp(s string) (string, string, bool) {
	for i := range len(s) {
		if s[i] == 'e' {
			return s[:i], s[i:], true
		}
	}
	return s, "", false
}

func trimZeros(s string) string {
	if !bytes.ContainsRune([]byte(s), '.') {
		return s
	}
	for len(s) > 0 && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return string(bytes.TrimSuffix([]byte(s), []byte(".")))
}

// dateStyle says how a BSON date becomes JSON.
type dateStyle int

const (
	// dateISO: "2019-01-23T19:42:56" (a Perl DateTime stringified: UTC,
	// no fraction, no zone).
	dateISO dateStyle = iota
	// dateEpoch: float seconds, e.g. 1548272576.574 (.epoch).
	dateEpoch
	// dateMillis: integer milliseconds (node timestamps).
	dateMillis
)

func formatDate(t time.Time, style dateStyle) any {
	t = t.UTC()
	switch style {
	case dateEpoch:
		ms := t.UnixMilli()
		if ms%1000 == 0 {
			return ms / 1000
		}
		return number(perlFloat(float64(ms) / 1000))
	case dateMillis:
		return t.UnixMilli()
	}
	return t.Format("2006-01-02T15:04:05")
}

// fromBSON converts a BSON value to the values above, as the Perl driver
// decodes it and the JSON encoder writes it.
func fromBSON(v bson.RawValue, dates dateStyle) any {
	switch v.Type {
	case bson.TypeEmbeddedDocument:
		return docToObj(v.Document(), dates)
	case bson.TypeArray:
		vals, _ := v.Array().Values()
		out := make([]any, len(vals))
		for i, el := range vals {
			out[i] = fromBSON(el, dates)
		}
		return out
	case bson.TypeString:
		return v.StringValue()
	case bson.TypeObjectID:
		return oid(v.ObjectID())
	case bson.TypeInt32:
		return v.Int32()
	case bson.TypeInt64:
		return v.Int64()
	case bson.TypeDouble:
		return nv(v.Double())
	case bson.TypeBoolean:
		return v.Boolean()
	case bson.TypeDateTime:
		return formatDate(v.Time(), dates)
	case bson.TypeDecimal128:
		return number(v.Decimal128().String())
	case bson.TypeTimestamp:
		t, _ := v.Timestamp()
		return int64(t)
	case bson.TypeBinary:
		_, data := v.Binary()
		return string(data)
	case bson.TypeRegex:
		p, _ := v.Regex()
		return p
	case bson.TypeSymbol:
		return v.Symbol()
	}
	return nil
}

func docToObj(d bson.Raw, dates dateStyle) obj {
	els, _ := d.Elements()
	out := make(obj, len(els))
	for _, el := range els {
		out[el.Key()] = fromBSON(el.Value(), dates)
	}
	return out
}

func timeFromEpoch(sec float64) time.Time {
	return time.UnixMilli(int64(math.Round(sec * 1000))).UTC()
}
