package Net::HTTP::Client;
# A stand-in for CPAN's Net::HTTP::Client (not packaged in Debian) for
# scripts/compat-4103.sh: just what Disbatch 4.103's t/002_full.t calls,
#   Net::HTTP::Client->request(METHOD => "host:port/path", Header => value, ..., [body])
# returning an HTTP::Response. One connection per request, no TE header.
use strict;
use warnings;
use HTTP::Request;
use LWP::UserAgent;

my $ua = LWP::UserAgent->new(keep_alive => 0, timeout => 30);
$ua->default_headers->remove_header('TE');

sub request {
    my ($class, $method, $url, @args) = @_;
    my $body = @args % 2 ? pop @args : undef;    # an odd last argument is the body
    $url = "http://$url" unless $url =~ m{^https?://};
    return $ua->request(HTTP::Request->new($method, $url, [@args], $body));
}

1;
