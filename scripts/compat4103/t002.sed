# t002.sed: the run-time edits scripts/compat-4103.sh makes to Disbatch
# 4.103's t/002_full.t (read from $PERL_DISBATCH_SRC, never stored in this
# repository) so that it tests a web server running elsewhere:
#   WEB=127.0.0.1:PORT     the server under test (instead of forking Disbatch::Web)
#   MONGO_URI, TEST_DB     the replica set and database that server uses
#   no SSL, no auth, no mongod of its own; TEST_DB is dropped first;
#   the 2.x MongoDB driver and Perl 5.36 (insert_one, keys %$ref);
#   three timing allowances for a busy machine (HARNESS(patience),
#   HARNESS(fresh-node), HARNESS(complete)), which change no expectation.
# Every edit leaves a "HARNESS(tag)" marker on the line it changes or adds;
# compat-4103.sh checks that each tag of this file appears in its output,
# so an edit that no longer applies fails loudly instead of being skipped.
# GNU sed; each pattern matches one whole line of 4.103's file.

s|^use Disbatch::Web;$|# use Disbatch::Web;  # HARNESS(no-web-module): the server under test runs elsewhere|
s|^my \$use_ssl = \$ENV{USE_SSL} // 1;$|my $use_ssl = 0;  # HARNESS(no-ssl)|
s|^my \$use_auth = \$ENV{USE_AUTH} // 1;$|my $use_auth = 0;  # HARNESS(no-auth)|
s|^if (!\$ENV{AUTHOR_TESTING} or \$ENV{SKIP_FULL_TESTS}) {$|if (0) {  # HARNESS(always-run)|

# The replica set and database of the server under test; keep the 1.x
# driver's DateTime dates (MongoDBCompat1x) instead of the SSL attributes.
s|^    mongohost => "localhost:\$mongoport",$|    mongohost => $ENV{MONGO_URI} // die("set MONGO_URI"),  # HARNESS(mongo-uri)|
s|^    database => "disbatch_test\$\$" \. int(rand(10000)),$|    database => $ENV{TEST_DB} // die("set TEST_DB"),  # HARNESS(test-db)|
s|^    attributes => { ssl => { SSL_verify_mode => 0x00 } },$|    attributes => { bson_codec => { dt_type => "DateTime" } },  # HARNESS(bson-codec)|
s|^delete \$config->{attributes} unless \$use_ssl;$|# HARNESS(keep-attributes): keep bson_codec|
s|^say `mongod \$mongo_args`;.*$|# HARNESS(no-mongod): the replica set at MONGO_URI is already running|
/^my \$test_db_root = retry { MongoDB->connect(.*get_database(\$config->{database}) } catch { die \$_ };$/a\
$test_db_root->drop;  # HARNESS(drop-db): start from an empty database

# MongoDB 2.x driver: insert is gone.
/^    retry { \$test_db_root->coll('users')->insert({username => \$username, migration => 'test'}) } catch { die \$_ };$/{
s|->insert({|->insert_one({|
s|$|  # HARNESS(insert-one)|
}

# The web server under test runs elsewhere: no fork, no kill.
s|^my \$webpid = daemonize();$|my $webpid = 0; my $harness_no_fork = 1;  # HARNESS(no-fork)|
s|^if (\$webpid == 0) {$|if (!$harness_no_fork) {  # HARNESS(no-fork-branch)|
s|^    my \$uri = "localhost:\$webport";$|    my $uri = $ENV{WEB} // die("set WEB=127.0.0.1:PORT");  # HARNESS(web)|
s|^        kill -9, \$webpid if \$webpid;$|        # HARNESS(no-kill): the server under test is not the test's own|

# Perl 5.36 refuses keys on a hash reference (an error since 5.28).
/sort keys \$content)/{
s|sort keys \$content)|sort keys %$content)|
s|$|  # HARNESS(keys-hashref)|
}

# Patience: a finished task's "complete" field must appear within 10 polls
# 0.5 s apart; writing 8 MB of output to GridFS can take longer on a busy
# machine, which would BAIL_OUT the whole test. Timing only, not behaviour.
s|^            my \$max = 10;$|            my $max = 60;  # HARNESS(patience)|

# Patience: the test marks its node fresh once, near the start, and expects
# GET /monitoring to still find it fresh (timestamp under 60 s old) some
# 550 lines later; on a busy machine more than 60 s pass. Refresh it just
# before. Timing only, not behaviour.
/^    \$res = Net::HTTP::Client->request(GET => "\$uri\/monitoring");$/i\
    $disbatch->update_node_status;  # HARNESS(fresh-node)

# The task of the report: 4.103's task_runner writes a task's status, then
# (a second update) its stdout, stderr and complete: true. Read between the
# two, the task had status 1 and no stdout yet, and "stdout matches" failed
# against the server's later answer (seen once, stop 37).
# Wait for the second write as well; the checks that follow are unchanged.
s|^    my \$task = retry { \$disbatch->tasks->find_one({_id => \$report->{task_id}, status => {'\$ne' => 0}}) or die 'status still 0' }\(.*\)$|    my $task = retry { $disbatch->tasks->find_one({_id => $report->{task_id}, status => {'$ne' => 0}, complete => {'$exists' => 1}}) or die 'status still 0, or its output not written yet' }\1  # HARNESS(complete)|
