// Package auth authenticates and authorizes the requests of disbatch-web:
// HTTP Basic for people and for the Disbatch 4.103 Perl CLI (realm
// "disbatch"), bearer tokens for programs, and three roles, read ⊂ write ⊂
// admin.
//
// Users (LoadFile, Parse) check a request's credentials (Authenticate);
// Middleware answers 401 or 403 or passes the request on with its
// Principal in the context (FromContext); RequiredRole is the server's
// default policy. Without a credentials file the server passes a nil
// *Users and authentication is off.
//
// # The credentials file
//
// One entry a line, four fields separated by spaces or tabs; blank lines
// and lines starting with # are ignored:
//
//	# KIND  NAME    ROLE   HASH
//	user    alice   write  pbkdf2-sha256$600000$<salt>$<key>
//	user    bob     admin  pbkdf2-sha256$600000$<salt>$<key>
//	token   ci-bot  read   sha256$<salt>$<digest>
//
// KIND is user (a password) or token (a bearer token). NAME is 1 to 64
// letters, digits and . _ @ - (not first), unique across users and tokens;
// it is the principal's name. ROLE is read, write or admin. HASH is made
// by disbatch-web passwd (HashPassword) or disbatch-web token (NewToken)
// and is one of
//
//	pbkdf2-sha256$ITERATIONS$SALT$KEY   PBKDF2-HMAC-SHA256
//	sha256$SALT$DIGEST                  SHA-256(SALT || token), tokens only
//
// with SALT and KEY in standard base64 (padding optional). The iteration
// count travels in the hash, so it can rise over time without breaking
// older lines; HashPassword uses DefaultIterations, tests use
// MinIterations to stay fast.
//
// Passwords are chosen by people and guessable, so they are stretched
// with PBKDF2, which makes each check cost a fraction of a second;
// Authenticate therefore remembers successful checks for a minute, and
// runs at most Options.MaxDerivations checks at once (one per core): a
// check that waits Options.DerivationWait for its turn fails with ErrBusy
// (503), so that a flood of bad passwords, never remembered, cannot take
// every core. Tokens
// are 256 random bits that no amount of guessing finds, so one salted
// SHA-256 is enough and a bearer check is cheap; a token line may also
// carry a PBKDF2 hash, at the price of a derivation per token line on
// each unremembered bearer request.
//
// A client that only speaks Basic, such as the Perl CLI, can use a token:
// the token line's NAME as the user name and the token as the password.
//
// Errors about the file name the line and never quote a hash or a field
// that could be a secret typed in the wrong column.
package auth
