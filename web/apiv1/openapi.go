package apiv1

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

// openAPIDocument is the OpenAPI 3.1 document of the API, written by hand
// next to the handlers. The tests check every response the handlers give
// against it, and every route against its paths.
//
//go:embed openapi.json
var openAPIDocument []byte

// Document returns the OpenAPI document as served by a handler made with
// these options: with plugins as the enum of PluginName when set, and
// without GET /api/v1/events when there is no event handler.
func Document(o Options) ([]byte, error) { return document(o.Plugins, o.Events != nil) }

func document(plugins []string, events bool) ([]byte, error) {
	if len(plugins) == 0 && events {
		return openAPIDocument, nil
	}
	var doc map[string]any
	if err := json.Unmarshal(openAPIDocument, &doc); err != nil {
		return nil, err
	}
	if len(plugins) > 0 {
		schemas, _ := dig(doc, "components", "schemas").(map[string]any)
		plugin, ok := schemas["PluginName"].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("no components.schemas.PluginName")
		}
		plugin["enum"] = plugins
	}
	if !events {
		paths, ok := doc["paths"].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("no paths")
		}
		delete(paths, "/api/v1/events")
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func dig(v any, keys ...string) any {
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}
