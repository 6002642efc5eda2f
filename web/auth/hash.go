package auth

import (
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// The hash schemes of the credentials file.
const (
	// SchemePBKDF2 is PBKDF2-HMAC-SHA256 with its iteration count in the
	// hash: pbkdf2-sha256$ITERATIONS$SALT$KEY. Passwords must use it.
	SchemePBKDF2 = "pbkdf2-sha256"
	// SchemeSHA256 is one SHA-256 over salt and secret: sha256$SALT$DIGEST.
	// Only tokens may use it (see NewToken).
	SchemeSHA256 = "sha256"
)

// DefaultIterations is the PBKDF2 iteration count HashPassword uses: OWASP's
// recommendation for PBKDF2-HMAC-SHA256 (2023).
const DefaultIterations = 600_000

// MinIterations and MaxIterations bound the iteration count a hash may
// carry: below RFC 8018's floor is no protection, and far above the
// default a single login would pin a CPU for seconds.
const (
	MinIterations = 1_000
	MaxIterations = 10_000_000
)

const (
	saltLen     = 16 // bytes of salt made here; a file may carry 8 to 64
	keyLen      = 32 // bytes of derived key or digest made here
	tokenBytes  = 32 // random bytes in a token: 256 bits
	tokenPrefix = "dbt_"
)

// b64 encodes salts and keys: standard alphabet, no padding. Decoding also
// accepts padding.
var b64 = base64.RawStdEncoding

// hash is a parsed hash field.
type hash struct {
	scheme string
	iter   int // SchemePBKDF2 only
	salt   []byte
	sum    []byte
}

// HashPassword hashes a password for a user line, with PBKDF2-HMAC-SHA256,
// DefaultIterations and a random salt.
func HashPassword(password string) (string, error) {
	return HashPasswordWithIterations(password, DefaultIterations)
}

// HashPasswordWithIterations is HashPassword with another iteration count,
// between MinIterations and MaxIterations. Tests use MinIterations to stay
// fast; production files should keep DefaultIterations.
func HashPasswordWithIterations(password string, iterations int) (string, error) {
	if password == "" {
		return "", errors.New("hash password: the password is empty")
	}
	if iterations < MinIterations || iterations > MaxIterations {
		return "", fmt.Errorf("hash password: iterations %d out of range [%d, %d]", iterations, MinIterations, MaxIterations)
	}
	h := hash{scheme: SchemePBKDF2, iter: iterations, salt: randomBytes(saltLen)}
	sum, err := h.derive(password, keyLen)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	h.sum = sum
	return h.String(), nil
}

// NewToken makes a bearer token and the hash to store in a token line.
// Show the token once to its owner; only the hash goes in the file.
//
// The token is 256 random bits, so the hash is one salted SHA-256
// (SchemeSHA256) rather than PBKDF2: stretching protects guessable
// secrets, and nobody can guess 256 bits however fast each guess is. This
// keeps every bearer request cheap without a cache.
func NewToken() (token, hash string, err error) {
	token = tokenPrefix + base64.RawURLEncoding.EncodeToString(randomBytes(tokenBytes))
	hash, err = HashToken(token)
	if err != nil {
		return "", "", err
	}
	return token, hash, nil
}

// HashToken hashes a token made elsewhere with SchemeSHA256. The token must
// be long and random (at least 32 characters); use a password and
// HashPassword for anything a person chose.
func HashToken(token string) (string, error) {
	if len(token) < 32 {
		return "", errors.New("hash token: a token needs at least 32 random characters (make one with NewToken)")
	}
	h := hash{scheme: SchemeSHA256, salt: randomBytes(saltLen)}
	h.sum = h.sha256(token)
	return h.String(), nil
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails: crypto/rand.Read crashes the program instead
	return b
}

// String formats h as it appears in the file.
func (h hash) String() string {
	if h.scheme == SchemePBKDF2 {
		return h.scheme + "$" + strconv.Itoa(h.iter) + "$" + b64.EncodeToString(h.salt) + "$" + b64.EncodeToString(h.sum)
	}
	return h.scheme + "$" + b64.EncodeToString(h.salt) + "$" + b64.EncodeToString(h.sum)
}

// expensive reports whether checking a secret against h costs a key
// derivation.
func (h hash) expensive() bool { return h.scheme == SchemePBKDF2 }

func (h hash) derive(secret string, n int) ([]byte, error) {
	return pbkdf2.Key(sha256.New, secret, h.salt, h.iter, n)
}

func (h hash) sha256(secret string) []byte {
	d := sha256.New()
	d.Write(h.salt)
	d.Write([]byte(secret))
	return d.Sum(nil)
}

// verify reports whether secret matches h, comparing in constant time.
func (h hash) verify(secret string) (bool, error) {
	var got []byte
	switch h.scheme {
	case SchemePBKDF2:
		var err error
		if got, err = h.derive(secret, len(h.sum)); err != nil {
			return false, fmt.Errorf("derive key: %w", err)
		}
	case SchemeSHA256:
		got = h.sha256(secret)
	default:
		return false, fmt.Errorf("unknown hash scheme %q", h.scheme)
	}
	return subtle.ConstantTimeCompare(got, h.sum) == 1, nil
}

// errHashFormat is the whole message for a hash field that is not one of
// ours. It never quotes the field: an operator may have pasted a password
// there.
var errHashFormat = errors.New(`want "pbkdf2-sha256$ITERATIONS$SALT$KEY" or "sha256$SALT$DIGEST" (make one with disbatch-web passwd or disbatch-web token)`)

// parseHash parses a hash field. Its errors never contain the field.
func parseHash(s string) (hash, error) {
	parts := strings.Split(s, "$")
	var h hash
	var salt, sum string
	switch {
	case parts[0] == SchemePBKDF2 && len(parts) == 4:
		iter, err := strconv.Atoi(parts[1])
		if err != nil || iter < MinIterations || iter > MaxIterations {
			return hash{}, fmt.Errorf("%s: iterations must be a number in [%d, %d]", SchemePBKDF2, MinIterations, MaxIterations)
		}
		h = hash{scheme: SchemePBKDF2, iter: iter}
		salt, sum = parts[2], parts[3]
	case parts[0] == SchemeSHA256 && len(parts) == 3:
		h = hash{scheme: SchemeSHA256}
		salt, sum = parts[1], parts[2]
	case parts[0] == SchemePBKDF2 || parts[0] == SchemeSHA256:
		return hash{}, fmt.Errorf("%s: wrong number of $-separated fields: %w", parts[0], errHashFormat)
	default:
		return hash{}, errHashFormat
	}
	var err error
	if h.salt, err = decodeB64(salt); err != nil || len(h.salt) < 8 || len(h.salt) > 64 {
		return hash{}, fmt.Errorf("%s: the salt must be 8 to 64 bytes in base64", h.scheme)
	}
	h.sum, err = decodeB64(sum)
	switch {
	case err != nil:
		return hash{}, fmt.Errorf("%s: the key is not base64", h.scheme)
	case h.scheme == SchemeSHA256 && len(h.sum) != sha256.Size:
		return hash{}, fmt.Errorf("%s: the digest must be %d bytes", h.scheme, sha256.Size)
	case h.scheme == SchemePBKDF2 && (len(h.sum) < 16 || len(h.sum) > 64):
		return hash{}, fmt.Errorf("%s: the key must be 16 to 64 bytes", h.scheme)
	}
	return h, nil
}

func decodeB64(s string) ([]byte, error) {
	return b64.DecodeString(strings.TrimRight(s, "="))
}
