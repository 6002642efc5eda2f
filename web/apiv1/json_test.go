package apiv1

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.mongodb.org/mongo-driver/v2/bson"
)

// plain turns a parsed value into what encoding/json decodes.
func plain(v value) any {
	switch v.kind {
	case kindNull:
		return nil
	case kindBool:
		return v.b
	case kindNumber:
		f, _ := strconv.ParseFloat(v.s, 64)
		return f
	case kindString:
		return v.s
	case kindArray:
		a := make([]any, len(v.arr))
		for i, e := range v.arr {
			a[i] = plain(e)
		}
		return a
	}
	m := map[string]any{}
	for _, mb := range v.obj {
		m[mb.key] = plain(mb.val)
	}
	return m
}

var jsonSeeds = []string{
	`{}`, `[]`, `0`, `-0`, `-0.5e-7`, `1E+2`, `"x"`, `true`, `false`, `null`, ` {"a" : [1, 2.5, "s", null, true, {"b": {}}]} `,
	`"\u00e9\ud83d\ude80\n\t\\\/\""`, `"\ud800"`, `"\udc00\u0041"`, `"\ud800\u0041"`, `"é🚀"`, `{"a":1,"a":2}`,
	`{`, `[1,]`, `{"a"}`, `{"a":}`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `"\x"`, `"\u12"`, "\"\x01\"", "\"\xff\"", `nul`, `truex`,
	`[1 2]`, `{"a":1 "b":2}`, `{1:2}`, "\ufeff{}", `{} {}`, `[[[[[[[[[[]]]]]]]]]]`, strings.Repeat("[", 200) + strings.Repeat("]", 200),
	`123456789012345678901234567890`, `1e400`, `"\u0000"`,
}

// FuzzParseJSON: the parser accepts exactly what encoding/json accepts,
// less duplicate keys and deep nesting, and reads the same values.
func FuzzParseJSON(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := parseJSON(data, 128)
		if err != nil {
			require.NotEmpty(t, err.msg)
			if err.tooDeep || strings.HasPrefix(err.msg, "duplicate key") || !utf8.Valid(data) {
				return
			}
			require.False(t, json.Valid(data), "refused valid JSON %q: %s", data, err.msg)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON %q", data)
		var want any
		if json.Unmarshal(data, &want) != nil {
			return // a number beyond float64: ours keeps its literal
		}
		require.Equal(t, want, plain(v), "%q", data)
	})
}

func TestParseJSONErrors(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]struct{ path, msg string }{
		`{"a":[1,{"b":tru}]}`:       {"a[1].b", "unexpected character"},
		`{"a":1,"b":{"c":2,"c":3}}`: {"b.c", `duplicate key "c"`},
		`{"x y":[0,01]}`:            {`["x y"][1]`, "invalid number"},
		`{"a":"\q"}`:                {"a", `invalid escape \q`},
		`[1,2`:                      {"", "unexpected end"},
		``:                          {"", "empty"},
		`  `:                        {"", "empty"},
	} {
		_, err := parseJSON([]byte(in), 10)
		require.NotNil(t, err, in)
		require.Equal(t, want.path, err.at.String(), in)
		require.Contains(t, err.msg, want.msg, in)
	}
	_, err := parseJSON([]byte(`{"a":[[{"b":[]}]]}`), 4)
	require.NotNil(t, err)
	require.True(t, err.tooDeep)
	require.Equal(t, "a[0][0].b", err.at.String())
	_, err = parseJSON([]byte(`{"a":[[{"b":1}]]}`), 4)
	require.Nil(t, err)
}

func TestParseJSONLongObjects(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("{")
	for i := range 100 {
		b.WriteString(`"k` + strconv.Itoa(i) + `":` + strconv.Itoa(i) + ",")
	}
	ok := b.String()[:b.Len()-1] + "}"
	v, err := parseJSON([]byte(ok), 2)
	require.Nil(t, err)
	require.Len(t, v.obj, 100)
	require.Equal(t, "k99", v.obj[99].key, "order kept")
	_, err = parseJSON([]byte(b.String()+`"k50":0}`), 2)
	require.NotNil(t, err)
	require.Equal(t, "k50", err.at.String())
}

// FuzzParamsRoundTrip: parameters that are accepted come back from BSON
// as the same JSON.
func FuzzParamsRoundTrip(f *testing.F) {
	for _, s := range jsonSeeds {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"z":1,"a":{"n":-2147483649,"f":0.1,"big":9223372036854775807,"over":9223372036854775808,"list":[1,"x",null]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, perr := parseJSON(data, maxBodyDepth)
		if perr != nil || v.kind != kindObject {
			return
		}
		raw, aerr := paramsToBSON(v, path{}.key("params"))
		if aerr != nil {
			require.NotEmpty(t, aerr.msg)
			return
		}
		out, err := paramsJSON(raw)
		require.NoError(t, err)
		var want, got any
		require.NoError(t, json.Unmarshal(data, &want))
		require.NoError(t, json.Unmarshal(out, &got), "%s", out)
		require.Equal(t, want, got, "%q -> %s", data, out)
		// The order of the keys is the client's.
		elems, err := raw.Elements()
		require.NoError(t, err)
		for i, e := range elems {
			require.Equal(t, v.obj[i].key, e.Key())
		}
	})
}

func TestParamsToBSON(t *testing.T) {
	t.Parallel()
	conv := func(s string) (bson.Raw, *apiError) {
		v, perr := parseJSON([]byte(s), maxBodyDepth)
		require.Nil(t, perr, s)
		return paramsToBSON(v, path{}.key("tasks").index(2).key("params"))
	}
	raw, err := conv(`{"i":2147483647,"j":2147483648,"k":-9223372036854775808,"l":1e2,"m":1.0,"n":18446744073709551616}`)
	require.Nil(t, err)
	for k, typ := range map[string]bson.Type{"i": bson.TypeInt32, "j": bson.TypeInt64, "k": bson.TypeInt64, "l": bson.TypeDouble, "m": bson.TypeDouble, "n": bson.TypeDouble} {
		require.Equal(t, typ, raw.Lookup(k).Type, k)
	}
	_, err = conv(nestedParams(64))
	require.Nil(t, err, "64 levels are fine")
	_, err = conv(`{"a":` + deep("[", "]", 63, "") + `}`)
	require.Nil(t, err)
	_, err = conv(nestedParams(65))
	require.Equal(t, CodeTooDeep, err.code)
	require.Equal(t, "tasks[2].params", err.field)
	_, err = conv(`{"a":{"b.c":1}}`)
	require.Equal(t, `tasks[2].params.a["b.c"]`, err.field)
}
