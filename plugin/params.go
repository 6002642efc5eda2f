package plugin

import (
	"fmt"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// emptyDoc is the BSON document {}.
var emptyDoc = bson.Raw{5, 0, 0, 0, 0}

// parameters returns t's parameters, {} when nil, or an error when they are
// not a valid document.
func parameters(t Task) (bson.Raw, error) {
	if len(t.Parameters) == 0 {
		return emptyDoc, nil
	}
	if err := t.Parameters.Validate(); err != nil {
		return nil, fmt.Errorf("parameters are not a valid BSON document: %w", err)
	}
	return t.Parameters, nil
}

// param returns parameters.key; absent, null and undefined give false.
func param(params bson.Raw, key string) (bson.RawValue, bool) {
	v, err := params.LookupErr(key)
	if err != nil || v.Type == bson.TypeNull || v.Type == bson.TypeUndefined {
		return bson.RawValue{}, false
	}
	return v, true
}

// stringParam reads an optional string parameter (required: a non-empty one).
func stringParam(params bson.Raw, key string, required bool) (string, error) {
	v, ok := param(params, key)
	if !ok {
		if required {
			return "", fmt.Errorf("parameters.%s is missing: want a non-empty string", key)
		}
		return "", nil
	}
	s, ok := v.StringValueOK()
	if !ok {
		return "", fmt.Errorf("parameters.%s must be a string, got %s", key, typeName(v))
	}
	if required && s == "" {
		return "", fmt.Errorf("parameters.%s is empty: want a non-empty string", key)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return "", fmt.Errorf("parameters.%s contains a NUL byte", key)
	}
	return s, nil
}

// stringsParam reads an optional array of strings.
func stringsParam(params bson.Raw, key string) ([]string, error) {
	v, ok := param(params, key)
	if !ok {
		return nil, nil
	}
	arr, ok := v.ArrayOK()
	if !ok {
		return nil, fmt.Errorf("parameters.%s must be an array of strings, got %s", key, typeName(v))
	}
	vals, err := arr.Values()
	if err != nil {
		return nil, fmt.Errorf("parameters.%s: %w", key, err)
	}
	out := make([]string, 0, len(vals))
	for i, e := range vals {
		s, ok := e.StringValueOK()
		if !ok {
			return nil, fmt.Errorf("parameters.%s.%d must be a string, got %s", key, i, typeName(e))
		}
		if strings.IndexByte(s, 0) >= 0 {
			return nil, fmt.Errorf("parameters.%s.%d contains a NUL byte", key, i)
		}
		out = append(out, s)
	}
	return out, nil
}

// envParam reads an optional object of string values as NAME=value entries.
func envParam(params bson.Raw, key string) ([]string, error) {
	v, ok := param(params, key)
	if !ok {
		return nil, nil
	}
	doc, ok := v.DocumentOK()
	if !ok {
		return nil, fmt.Errorf("parameters.%s must be an object of strings, got %s", key, typeName(v))
	}
	elems, err := doc.Elements()
	if err != nil {
		return nil, fmt.Errorf("parameters.%s: %w", key, err)
	}
	out := make([]string, 0, len(elems))
	for _, e := range elems {
		name := e.Key()
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return nil, fmt.Errorf("parameters.%s: %q is not a valid environment variable name", key, name)
		}
		s, ok := e.Value().StringValueOK()
		if !ok {
			return nil, fmt.Errorf("parameters.%s.%s must be a string, got %s", key, name, typeName(e.Value()))
		}
		if strings.IndexByte(s, 0) >= 0 {
			return nil, fmt.Errorf("parameters.%s.%s contains a NUL byte", key, name)
		}
		out = append(out, name+"="+s)
	}
	return out, nil
}

func typeName(v bson.RawValue) string {
	switch v.Type {
	case bson.TypeString:
		return "a string"
	case bson.TypeInt32, bson.TypeInt64, bson.TypeDouble, bson.TypeDecimal128:
		return "a number"
	case bson.TypeBoolean:
		return "a boolean"
	case bson.TypeArray:
		return "an array"
	case bson.TypeEmbeddedDocument:
		return "an object"
	}
	return v.Type.String()
}
