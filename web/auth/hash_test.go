package auth

import (
	"encoding/base64"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHashPasswordRoundTrip(t *testing.T) {
	t.Parallel()
	h1, err := HashPasswordWithIterations("pässwörd", MinIterations)
	require.NoError(t, err)
	h2, err := HashPasswordWithIterations("pässwörd", MinIterations)
	require.NoError(t, err)
	require.NotEqual(t, h1, h2, "salts are random")
	require.True(t, strings.HasPrefix(h1, "pbkdf2-sha256$1000$"), h1)
	require.NotContains(t, h1, "pässwörd")

	for _, h := range []string{h1, h2} {
		parsed, err := parseHash(h)
		require.NoError(t, err)
		require.Equal(t, h, parsed.String())
		ok, err := parsed.verify("pässwörd")
		require.NoError(t, err)
		require.True(t, ok)
		for _, wrong := range []string{"passwörd", "pässwörd ", "", "PÄSSWÖRD"} {
			ok, err = parsed.verify(wrong)
			require.NoError(t, err)
			require.False(t, ok, wrong)
		}
	}
}

func TestHashPasswordDefaults(t *testing.T) {
	t.Parallel()
	h, err := HashPassword("a real password")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(h, "pbkdf2-sha256$600000$"), h)
	parsed, err := parseHash(h)
	require.NoError(t, err)
	require.Len(t, parsed.salt, saltLen)
	require.Len(t, parsed.sum, keyLen)

	_, err = HashPassword("")
	require.ErrorContains(t, err, "empty")
	_, err = HashPasswordWithIterations("x", MinIterations-1)
	require.ErrorContains(t, err, "out of range")
	_, err = HashPasswordWithIterations("x", MaxIterations+1)
	require.ErrorContains(t, err, "out of range")
}

func TestNewToken(t *testing.T) {
	t.Parallel()
	tok1, h1, err := NewToken()
	require.NoError(t, err)
	tok2, h2, err := NewToken()
	require.NoError(t, err)
	require.NotEqual(t, tok1, tok2)
	require.NotEqual(t, h1, h2)
	require.True(t, strings.HasPrefix(tok1, tokenPrefix))
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(tok1, tokenPrefix))
	require.NoError(t, err)
	require.Len(t, raw, tokenBytes)
	require.True(t, strings.HasPrefix(h1, "sha256$"), h1)
	require.NotContains(t, h1, tok1)

	parsed, err := parseHash(h1)
	require.NoError(t, err)
	ok, err := parsed.verify(tok1)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = parsed.verify(tok2)
	require.NoError(t, err)
	require.False(t, ok)

	_, err = HashToken("short")
	require.ErrorContains(t, err, "at least 32")
}

func TestParseHashAcceptsPadding(t *testing.T) {
	t.Parallel()
	h, err := HashToken(strings.Repeat("t", 40))
	require.NoError(t, err)
	parts := strings.Split(h, "$")
	padded := parts[0] + "$" + parts[1] + "==$" + parts[2] + "="
	p1, err := parseHash(h)
	require.NoError(t, err)
	p2, err := parseHash(padded)
	require.NoError(t, err)
	require.Equal(t, p1, p2)
}

// TestSecretsAreComparedInConstantTime reads the package's source: secrets
// are compared with crypto/subtle in verify, and nothing compares bytes
// with a function that returns early.
func TestSecretsAreComparedInConstantTime(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	constantTimeInVerify := false
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		f, err := parser.ParseFile(fset, name, src, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			call := pkg.Name + "." + sel.Sel.Name
			switch call {
			case "bytes.Equal", "bytes.Compare", "reflect.DeepEqual", "slices.Equal", "slices.Compare":
				t.Errorf("%s: %s returns early; compare secrets with subtle.ConstantTimeCompare", fset.Position(sel.Pos()), call)
			}
			return true
		})
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name != "verify" {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && sel.Sel.Name == "ConstantTimeCompare" {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "subtle" {
						constantTimeInVerify = true
					}
				}
				return true
			})
		}
	}
	require.True(t, constantTimeInVerify, "verify must compare with subtle.ConstantTimeCompare")
}
