package apiv1

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// The request bodies are parsed by this small strict parser rather than
// encoding/json, for what encoding/json does not give: the path of every
// problem (tasks[3].params.x), objects in their key order (parameters
// become BSON documents in the order the client wrote them), duplicate
// keys refused, and a depth limit far below encoding/json's 10,000 that
// is checked before any deep recursion.

type kind uint8

const (
	kindNull kind = iota
	kindBool
	kindNumber
	kindString
	kindArray
	kindObject
)

// value is a parsed JSON value.
type value struct {
	kind kind
	b    bool
	// s is a string's text, or a number's literal as written.
	s   string
	arr []value
	obj []member
}

type member struct {
	key string
	val value
}

// describe names a value's type for an error message.
func (v value) describe() string {
	switch v.kind {
	case kindNull:
		return "null"
	case kindBool:
		return strconv.FormatBool(v.b)
	case kindNumber:
		return "the number " + v.s
	case kindString:
		return "a string"
	case kindArray:
		return "an array"
	}
	return "an object"
}

// intLiteral reports whether a number was written without a fraction or
// an exponent.
func (v value) intLiteral() bool { return !strings.ContainsAny(v.s, ".eE") }

// path is where a value sits in a body: object keys and array indexes.
type path []segment

type segment struct {
	key   string
	index int // when key == "" and isIndex
	isIdx bool
}

func (p path) key(k string) path { return append(p[:len(p):len(p)], segment{key: k}) }
func (p path) index(i int) path  { return append(p[:len(p):len(p)], segment{index: i, isIdx: true}) }

// String renders the path as in JavaScript: tasks[3].params.user, with
// keys that are not identifiers quoted: params["a b"].
func (p path) String() string {
	var b strings.Builder
	for i, s := range p {
		switch {
		case s.isIdx:
			b.WriteString("[" + strconv.Itoa(s.index) + "]")
		case isIdentifier(s.key):
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key)
		default:
			b.WriteString("[" + strconv.Quote(s.key) + "]")
		}
	}
	return b.String()
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// parseError is a syntax error, a duplicate key or too deep a nesting,
// with the path where it was found.
type parseError struct {
	msg     string
	at      path
	tooDeep bool
}

func (e *parseError) Error() string { return e.msg }

type parser struct {
	data     []byte
	pos      int
	maxDepth int
	stack    path
}

// parseJSON parses one JSON value (RFC 8259: UTF-8, no byte order mark,
// nothing but white space after it) nested at most maxDepth arrays and
// objects deep.
func parseJSON(data []byte, maxDepth int) (value, *parseError) {
	p := &parser{data: data, maxDepth: maxDepth}
	p.space()
	if p.pos == len(p.data) {
		return value{}, p.fail("the body is empty; want a JSON object")
	}
	v, err := p.value(0)
	if err != nil {
		return value{}, err
	}
	p.space()
	if p.pos != len(p.data) {
		return value{}, p.fail("unexpected data after the JSON value")
	}
	return v, nil
}

func (p *parser) fail(format string, args ...any) *parseError {
	return &parseError{msg: fmt.Sprintf("invalid JSON at byte %d: ", p.pos) + fmt.Sprintf(format, args...), at: append(path(nil), p.stack...)}
}

func (p *parser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *parser) value(depth int) (value, *parseError) {
	if p.pos >= len(p.data) {
		return value{}, p.fail("unexpected end of the body")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		return value{kind: kindString, s: s}, err
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case p.literal("true"):
		return value{kind: kindBool, b: true}, nil
	case p.literal("false"):
		return value{kind: kindBool}, nil
	case p.literal("null"):
		return value{kind: kindNull}, nil
	}
	r, _ := utf8.DecodeRune(p.data[p.pos:])
	return value{}, p.fail("unexpected character %q", r)
}

func (p *parser) literal(word string) bool {
	if strings.HasPrefix(string(p.data[p.pos:min(p.pos+len(word), len(p.data))]), word) {
		p.pos += len(word)
		return true
	}
	return false
}

func (p *parser) deep(depth int) *parseError {
	if depth <= p.maxDepth {
		return nil
	}
	return &parseError{msg: fmt.Sprintf("JSON nested more than %d levels deep", p.maxDepth), at: append(path(nil), p.stack...), tooDeep: true}
}

func (p *parser) object(depth int) (value, *parseError) {
	if err := p.deep(depth); err != nil {
		return value{}, err
	}
	p.pos++ // {
	v := value{kind: kindObject}
	var seen map[string]bool
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return value{}, p.fail("want a string as an object key")
		}
		key, err := p.str()
		if err != nil {
			return value{}, err
		}
		p.stack = append(p.stack, segment{key: key})
		if len(v.obj) < 16 {
			for _, m := range v.obj {
				if m.key == key {
					return value{}, &parseError{msg: fmt.Sprintf("duplicate key %q", key), at: append(path(nil), p.stack...)}
				}
			}
		} else {
			if seen == nil {
				seen = make(map[string]bool, 32)
				for _, m := range v.obj {
					seen[m.key] = true
				}
			}
			if seen[key] {
				return value{}, &parseError{msg: fmt.Sprintf("duplicate key %q", key), at: append(path(nil), p.stack...)}
			}
			seen[key] = true
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return value{}, p.fail("want ':' after an object key")
		}
		p.pos++
		p.space()
		val, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		p.stack = p.stack[:len(p.stack)-1]
		v.obj = append(v.obj, member{key: key, val: val})
		p.space()
		if p.pos >= len(p.data) {
			return value{}, p.fail("unexpected end of the body in an object")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return value{}, p.fail("want ',' or '}' in an object")
		}
	}
}

func (p *parser) array(depth int) (value, *parseError) {
	if err := p.deep(depth); err != nil {
		return value{}, err
	}
	p.pos++ // [
	v := value{kind: kindArray}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for i := 0; ; i++ {
		p.space()
		p.stack = append(p.stack, segment{index: i, isIdx: true})
		val, err := p.value(depth)
		if err != nil {
			return value{}, err
		}
		p.stack = p.stack[:len(p.stack)-1]
		v.arr = append(v.arr, val)
		p.space()
		if p.pos >= len(p.data) {
			return value{}, p.fail("unexpected end of the body in an array")
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return value{}, p.fail("want ',' or ']' in an array")
		}
	}
}

// str reads a string: UTF-8, control characters escaped. An escaped lone
// surrogate becomes U+FFFD, as encoding/json does.
func (p *parser) str() (string, *parseError) {
	p.pos++ // "
	start := p.pos
	// Fast path: no escapes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := p.data[start:p.pos]
			if !utf8.Valid(s) {
				return "", p.fail("a string is not valid UTF-8")
			}
			p.pos++
			return string(s), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", p.fail("a control character in a string must be escaped")
		}
		p.pos++
	}
	b := []byte(nil)
	b = append(b, p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			if !utf8.Valid(b) {
				return "", p.fail("a string is not valid UTF-8")
			}
			p.pos++
			return string(b), nil
		case c < 0x20:
			return "", p.fail("a control character in a string must be escaped")
		case c != '\\':
			b = append(b, c)
			p.pos++
			continue
		}
		p.pos++ // backslash
		if p.pos >= len(p.data) {
			break
		}
		e := p.data[p.pos]
		p.pos++
		switch e {
		case '"', '\\', '/':
			b = append(b, e)
		case 'b':
			b = append(b, '\b')
		case 'f':
			b = append(b, '\f')
		case 'n':
			b = append(b, '\n')
		case 'r':
			b = append(b, '\r')
		case 't':
			b = append(b, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", p.fail(`want four hex digits after \u`)
			}
			if utf16.IsSurrogate(r) {
				r2 := utf8.RuneError
				if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
					save := p.pos
					p.pos += 2
					if lo, ok := p.hex4(); ok && utf16.DecodeRune(r, lo) != utf8.RuneError {
						r2 = utf16.DecodeRune(r, lo)
					} else {
						p.pos = save
					}
				}
				r = r2
			}
			b = utf8.AppendRune(b, r)
		default:
			p.pos--
			return "", p.fail("invalid escape \\%c in a string", e)
		}
	}
	return "", p.fail("unterminated string")
}

func (p *parser) hex4() (rune, bool) {
	if p.pos+4 > len(p.data) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.data[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.pos += 4
	return rune(n), true
}

// number reads -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() (value, *parseError) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos < len(p.data) && p.data[p.pos] == '0':
		p.pos++
	case digits() == 0:
		return value{}, p.fail("invalid number")
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return value{}, p.fail("invalid number: want digits after '.'")
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return value{}, p.fail("invalid number: want digits in the exponent")
		}
	}
	if p.pos < len(p.data) {
		if c := p.data[p.pos]; c >= '0' && c <= '9' || c == '.' {
			return value{}, p.fail("invalid number")
		}
	}
	return value{kind: kindNumber, s: string(p.data[start:p.pos])}, nil
}
