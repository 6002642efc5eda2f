package auth

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// Method is how a principal authenticated.
type Method string

// The methods of Authenticate.
const (
	MethodBasic  Method = "basic"  // HTTP Basic: a user's password, or a token's name and the token
	MethodBearer Method = "bearer" // Authorization: Bearer <token>
)

// Principal is who made a request, and what they may do.
type Principal struct {
	Name   string // the NAME of the user or token line
	Role   Role
	Method Method
}

// The errors of Authenticate. Other errors (a failed key derivation) are
// the server's fault, not the client's.
var (
	// ErrNoCredentials: the request has no Authorization header.
	ErrNoCredentials = errors.New("no credentials")
	// ErrBadCredentials: an unknown name, a wrong password or token, or an
	// Authorization header that is malformed or of another scheme.
	ErrBadCredentials = errors.New("bad credentials")
	// ErrBusy: every slot for a password check was taken for
	// Options.DerivationWait (many logins at once, or someone trying
	// passwords); the client should try again shortly.
	ErrBusy = errors.New("too many password checks at once")
)

// The cache of successful verifications, by default.
const (
	DefaultCacheSize = 1024
	DefaultCacheTTL  = time.Minute
)

// maxSecretLen bounds the passwords and tokens Authenticate will hash.
const maxSecretLen = 1024

// Options tune a Users. The zero value is the defaults.
type Options struct {
	// CacheSize is how many successful verifications are remembered:
	// 0 means DefaultCacheSize, a negative size turns the cache off.
	CacheSize int
	// CacheTTL is how long one is remembered: 0 means DefaultCacheTTL, a
	// negative TTL turns the cache off.
	CacheTTL time.Duration
	// Now is the time source of the cache; nil means time.Now.
	Now func() time.Time
	// MaxDerivations bounds the password checks (PBKDF2: hundreds of
	// milliseconds of a core each) run at once: 0 means GOMAXPROCS. A
	// stream of bad passwords, which are never cached, would otherwise
	// take every core.
	MaxDerivations int
	// DerivationWait is how long a check waits for a free slot before
	// the request is answered ErrBusy: 0 means DefaultDerivationWait.
	DerivationWait time.Duration
}

// DefaultDerivationWait is Options.DerivationWait's default.
const DefaultDerivationWait = 2 * time.Second

// Users are the credentials of one file, ready to authenticate requests.
// A Users never changes after Parse; to reload the file, parse it again
// and swap the pointer. It is safe for concurrent use.
type Users struct {
	byName map[string]*entry
	tokens []*entry
	// dummy is checked for unknown names so that they cost as much as a
	// wrong password; its scheme is empty when no entry is expensive.
	dummy hash
	cache *cache // nil when off
	// cacheKey keys the HMAC that names cache entries, so that the cache
	// never holds a fast hash of a password. Random per Users.
	cacheKey []byte
	// derivations counts the expensive checks (PBKDF2), for tests.
	derivations atomic.Int64
	// slots holds a token per expensive check running (MaxDerivations).
	slots         chan struct{}
	derivationFor time.Duration
	// flight shares one check among requests with the same credentials
	// at once (tabs reconnecting, parallel CLI runs after a restart):
	// each would take a slot and a derivation of its own.
	flight singleflight.Group
}

func newUsers(entries []entry) *Users {
	u := &Users{byName: make(map[string]*entry, len(entries))}
	for i := range entries {
		e := &entries[i]
		u.byName[e.name] = e
		if e.kind == KindToken {
			u.tokens = append(u.tokens, e)
		}
		if e.hash.expensive() && e.hash.iter > u.dummy.iter {
			u.dummy = hash{scheme: SchemePBKDF2, iter: e.hash.iter, salt: randomBytes(saltLen), sum: make([]byte, keyLen)}
		}
	}
	return u.withOptions(Options{})
}

// WithOptions returns a Users with the same credentials, tuned by o, and
// an empty cache.
func (u *Users) WithOptions(o Options) *Users {
	return (&Users{byName: u.byName, tokens: u.tokens, dummy: u.dummy}).withOptions(o)
}

func (u *Users) withOptions(o Options) *Users {
	size, ttl := o.CacheSize, o.CacheTTL
	if size == 0 {
		size = DefaultCacheSize
	}
	if ttl == 0 {
		ttl = DefaultCacheTTL
	}
	u.cache = nil
	if size > 0 && ttl > 0 {
		u.cache = newCache(size, ttl, o.Now)
	}
	u.cacheKey = randomBytes(32)
	n := o.MaxDerivations
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	u.slots = make(chan struct{}, n)
	u.derivationFor = cmp.Or(o.DerivationWait, DefaultDerivationWait)
	return u
}

// Len returns the number of users and tokens.
func (u *Users) Len() int { return len(u.byName) }

// Authenticate returns who made r: HTTP Basic with a user's name and
// password (or a token's name and the token), or "Authorization: Bearer
// TOKEN". It returns ErrNoCredentials when r has no Authorization header
// and ErrBadCredentials, possibly wrapped, when its credentials are wrong.
// Errors never contain a secret.
//
// Secrets are compared in constant time, and an unknown name costs a key
// derivation like a wrong password. Successful verifications are
// remembered for a while (Options), keyed by an HMAC of name and secret:
// the same name and secret pass again without a derivation, anything else
// is verified in full. Failures are never remembered.
func (u *Users) Authenticate(r *http.Request) (Principal, error) {
	h := r.Header.Get("Authorization")
	if h == "" {
		return Principal{}, ErrNoCredentials
	}
	scheme, rest, _ := strings.Cut(h, " ")
	switch {
	case strings.EqualFold(scheme, "Basic"):
		name, password, ok := r.BasicAuth()
		if !ok {
			return Principal{}, fmt.Errorf("%w: malformed Basic credentials", ErrBadCredentials)
		}
		return u.basic(name, password)
	case strings.EqualFold(scheme, "Bearer"):
		token := strings.TrimSpace(rest)
		if token == "" {
			return Principal{}, fmt.Errorf("%w: empty bearer token", ErrBadCredentials)
		}
		return u.bearer(token)
	default:
		return Principal{}, fmt.Errorf("%w: unsupported authorization scheme, use Basic or Bearer", ErrBadCredentials)
	}
}

func (u *Users) basic(name, password string) (Principal, error) {
	if len(password) > maxSecretLen {
		return Principal{}, ErrBadCredentials
	}
	key := u.key('b', name, password)
	if p, ok := u.cache.get(key); ok {
		return p, nil
	}
	p, err, _ := u.flight.Do(string(key[:]), func() (any, error) { return u.basicCheck(key, name, password) })
	return p.(Principal), err
}

// basicCheck is basic's check of credentials the cache did not have.
func (u *Users) basicCheck(key [sha256.Size]byte, name, password string) (Principal, error) {
	e := u.byName[name]
	if e == nil {
		if u.dummy.scheme != "" {
			// Busy like a known name's check would be: the answer must
			// not tell the names apart.
			if _, err := u.check(u.dummy, password); errors.Is(err, ErrBusy) {
				return Principal{}, ErrBusy
			}
		}
		return Principal{}, ErrBadCredentials
	}
	ok, err := u.check(e.hash, password)
	if err != nil {
		return Principal{}, fmt.Errorf("check the password of %s %q: %w", e.kind, e.name, err)
	}
	if !ok {
		return Principal{}, ErrBadCredentials
	}
	p := Principal{Name: e.name, Role: e.role, Method: MethodBasic}
	u.cache.put(key, p)
	return p, nil
}

func (u *Users) bearer(token string) (Principal, error) {
	if len(token) > maxSecretLen {
		return Principal{}, ErrBadCredentials
	}
	key := u.key('t', "", token)
	if p, ok := u.cache.get(key); ok {
		return p, nil
	}
	// Every token is checked, whichever matches: the time taken does not
	// tell which one did.
	var match *entry
	for _, e := range u.tokens {
		ok, err := u.check(e.hash, token)
		if err != nil {
			return Principal{}, fmt.Errorf("check a bearer token against token %q: %w", e.name, err)
		}
		if ok && match == nil {
			match = e
		}
	}
	if match == nil {
		return Principal{}, ErrBadCredentials
	}
	p := Principal{Name: match.name, Role: match.role, Method: MethodBearer}
	u.cache.put(key, p)
	return p, nil
}

func (u *Users) check(h hash, secret string) (bool, error) {
	if h.expensive() {
		t := time.NewTimer(u.derivationFor)
		select {
		case u.slots <- struct{}{}:
			t.Stop()
			defer func() { <-u.slots }()
		case <-t.C:
			return false, ErrBusy
		}
		u.derivations.Add(1)
	}
	return h.verify(secret)
}

// key names a cache entry: an HMAC, under a key of this Users, of the
// method, the length-prefixed name and the secret.
func (u *Users) key(method byte, name, secret string) [sha256.Size]byte {
	m := hmac.New(sha256.New, u.cacheKey)
	var b [5]byte
	b[0] = method
	binary.BigEndian.PutUint32(b[1:], uint32(len(name)))
	m.Write(b[:])
	m.Write([]byte(name))
	m.Write([]byte(secret))
	var k [sha256.Size]byte
	m.Sum(k[:0])
	return k
}
