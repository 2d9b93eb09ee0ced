//! fencegate: a fencing-token enforcing reverse proxy for S3-compatible
//! object storage. See README.md for what it is and how to run it, and
//! `docs/contract.md` for what it guarantees.
//!
//! # Layout
//!
//! A request comes in through [`server`] (which accepts its connection),
//! [`workers`] (which gives it a serving thread) and [`connection`] (which
//! serves it there), is handled by [`proxy`] (which reads it with [`s3`],
//! fences it with [`fence`] and forwards it with [`upstream`]), and its
//! answer goes back the same way. Arrows say which
//! way a module depends; `scripts/module-graph` checks that none goes round
//! in a circle.
//!
//! # Words
//!
//! Each word below means one thing in the code and the docs:
//!
//! - **token**: the fencing token, a number from a lock service. Three
//!   other things are called tokens where AWS or the configuration name
//!   them: the *session token* (`x-amz-security-token`, of a session
//!   credential, [`s3::session`]), the credentials endpoint's
//!   *authorization token* (`AWS_CONTAINER_AUTHORIZATION_TOKEN`,
//!   [`locks::endpoint`]) and the admin API's *bearer*, the **admin
//!   bearer** (`server.admin_token`, `--admin-token`,
//!   `Config::admin_bearer`). None is ever "the token", and help texts say
//!   "admin bearer".
//! - **fence**: a resource's highest accepted token; **raise**: making a
//!   higher one durable; **admit**: the gate letting a request through
//!   (check, raise, ordering barrier, [`fence::gate`]).
//! - **fence table**: where fences are kept (`FenceTable`: `fences.redb`
//!   on one node, etcd in cluster mode, [`fence::table`]).
//! - **store**: the object store behind fencegate, the *backend*: the
//!   *embedded store* ([`store`], called in-process) or an S3 endpoint.
//! - **commit**: the embedded store's group commit (`store/commit.rs`),
//!   and a database's own transaction commit. The **body gate**
//!   ([`fence::body_gate`]) is what lets a write's last frame go.
//! - **hold**: an object's hold, where a conditional write's check and
//!   write are one step ([`fence::hold`], `ObjectHold`); its `Holder` says
//!   whose it is (`Holder::ThisOwner`, `Holder::AnyReplica`). Nothing
//!   else in the fencing path is an object hold; the wait after a lease
//!   expires (`Cluster::expired_hold`, "the expiry hold") and a blob kept
//!   while it is read (`Blobs::hold_for_read`) are holds of their own.
//!   **permit**: a write's place in the ordering barrier.
//!   **keep**: what a write's exchange keeps until its answer is complete,
//!   its permits, object hold and landing slots (`proxy/forward.rs`:
//!   `Keep`, and `KeptBody`, the answer that carries them). A lock is
//!   *taken* (`locks::TakenLock`, `fencegate lock`'s) and its **holder**
//!   is whoever has it (the lock services' word; `issued::Holding`, what
//!   is known of the holder's token).
//! - **route**: phase 6, where a request is served (`proxy/route.rs`);
//!   **forward**: phase 9, the exchange with the backend
//!   (`proxy/forward.rs`); **to the owner**: a request sent to the
//!   replica owning its resource (`proxy/to_owner.rs`); **relay**: a
//!   request sent to a peer by a replica cut off from etcd.
//! - **owner**, **tenure**, **epoch**: the replica admitting a resource's
//!   writes, its time as owner, and the number etcd gave that time
//!   (`Cluster::tenure_stands`; the gate's `OwnerTenure` is this
//!   replica's cluster and tenure). **At the owner**: served by another
//!   replica that owns the resource (`Admission::AtOwner`,
//!   `Route::AtOwner`). **Moved**: an owner's answer to a request
//!   forwarded at an epoch that is not its own any more (nothing done);
//!   `Refusal::TenureLost` is the gate finding its own tenure over.
//! - **peer**: another replica. `proxy/peers.rs` holds the connections to
//!   them; `fence/cluster/directory.rs` is where they are listed in etcd.
//! - **quarantine**: how long a write may still land after its answer was
//!   lost with its whole body at the backend, or after a restart found it
//!   in the landing record; **in doubt**: such a write
//!   ([`fence::doubt`]), which keeps its place for the quarantine unless
//!   the backend settles it sooner.
//! - **read**: an S3 read (GET, HEAD, a listing), which a token may
//!   raise a fence with but never needs. The one function called just
//!   `read` is `Store::read` (`store/read.rs`), the S3 read every GET and
//!   HEAD of the embedded store is answered from; below it, the store's
//!   are `in_read_txn` (a redb read transaction) and `Blobs::read_now` and
//!   `Blobs::stream_range` (a blob's bytes, at once or streamed), the index
//!   file's is `DbFile::database`.
//! - **transport**: how `upstream::client` reaches the backend (over the
//!   wire, or in-process to the embedded store); not a route.
//! - **effect**: what an operation does to what: reads or writes the
//!   service, a bucket or objects (`s3::op::Effect`, which CONTRACT §2's
//!   fenced writes are read from).
//! - **access**: how fencegate reaches a lock service: TLS, client
//!   certificate, user and password (the `*_access` tables,
//!   `config::access::AccessConfig`, applied by [`access`]). An *access
//!   key* is an S3 credential's id, and the *access log* a request's one
//!   line; the embedded store's own check of its callers is
//!   `SignedOrTrusted` (`upstream/embedded.rs`).
//! - **key file**: a file with a TLS private key (a lock service's client
//!   key, `AccessConfig::tls_key_file`; the S3 listener's is
//!   `server.tls_key`) or with a session key
//!   (`SessionsConfig::session_key_file`); both tables spell it `key_file`.
//! - **secret**: a configured secret string, never printed
//!   (`config::Secret`: the admin bearer, the backend's secret key); a
//!   lock service's password is a `Password`.
//! - **issue**: to give out. A lock issues tokens to its holders; verified
//!   raises ask the locks of verified resources (`fence::issued::Issuers`)
//!   `Whose` a token is. The admin API issues session credentials
//!   (`SessionIssuer`, each a `SessionCredential`), which `fencegate
//!   credentials` and `fencegate lock` read as a `CredentialsReply`;
//!   `--credentials-endpoint` gets them from its `CredsSource`.
//!
//! # Modules
//!
//! Leaves (depend on no other module of the crate):
//!
//! - [`config`]: the TOML file, its defaults, one validator per table
//!   (`validate.rs`); `config/locks.rs` is the `[locks]` table and the
//!   `[[eager]]` entries; `config/access.rs` the `*_access` tables (TLS,
//!   client certificates, users and password files of the services);
//!   `config/tests.rs` its tests.
//! - [`metric_names`] (→ per_thread): the Prometheus metric names, for
//!   every module that records one, and what every request records: the
//!   histograms' handles and each serving thread's tallies.
//! - [`body`]: `ProxyBody`, the body type of every response fencegate sends.
//! - [`tls`]: rustls configs, for the HTTPS listener and https backends.
//! - [`utc`]: calendar dates from Unix seconds (SigV4 dates, log lines).
//! - [`per_thread`]: `PerThread`, one piece of something for each serving
//!   thread (the pool's kept connections, the log's buffer).
//! - [`log_buffer`] (→ per_thread): log lines on their way to stderr,
//!   appended to the serving thread's own buffer, written out in batches
//!   by a thread of their own.
//! - [`access_log`] (→ utc, log_buffer): the request line, formatted by hand.
//!
//! - [`access`] (→ config): how etcd, ZooKeeper, Redis and PostgreSQL are
//!   reached: TLS, client certificates, passwords from files or variables
//!   (`pg_tls.rs`: libpq's `sslmode` over rustls).
//!
//! The fence (→ access, config, metric_names, redb_file):
//!
//! - [`fence::token`]: a token from its carriers (header, query, metadata).
//! - [`fence::resource`]: `[[rules]]` (bucket, prefix) → the resource fenced.
//! - [`fence::gate`]: the check, the durable raise, the ordering barrier
//!   (`gate/barrier.rs`, which waits for writes in flight and in doubt);
//!   `gate/owned.rs`: cluster mode with owners, the resources this replica
//!   owns admitted as on a single node, the others answered with their
//!   owner for the proxy to forward to (`gate/owned/markers.rs`: the
//!   in-flight markers in etcd); `gate/cluster.rs`: cluster mode without
//!   owners (one etcd transaction per request), and following raises made at other
//!   replicas (both modes); `gate/outcome.rs`: what it answers
//!   (`Admission`, `Refusal`); `gate/tests.rs`: its tests.
//! - [`fence::body_gate`]: the body gate, holding a write's last body frame
//!   until its permit (and object hold) confirms, and marking the write's
//!   slot in the landing record whole.
//! - [`fence::landing`]: the landing record (`<data_dir>/landing`), a
//!   mapped file in which every write to a remote backend has a slot
//!   until its answer is read, so that a restart knows what may still land
//!   (`landing/record.rs`: a write's slot; `landing/tests.rs`: its tests).
//! - [`fence::doubt`]: writes in doubt (whole at the backend, their answer
//!   lost or their sender dead), what they hold back and what the backend
//!   settles; its tests in `doubt/tests.rs`.
//! - [`fence::issued`]: verified raises, what the gate asks a resource's
//!   lock before a token raises its fence (`gate/verified.rs` asks it,
//!   `locks::issued` answers).
//! - [`fence::hold`]: the object hold, where a conditional write's check and
//!   write become one step (CONTRACT §8); in cluster mode its keys are in
//!   etcd (`cluster/holds.rs`); its tests in `hold/tests.rs`.
//! - [`fence::cluster`]: cluster mode, the fences in etcd, shared by the
//!   replicas. With owners (the default): `owners.rs` takes a resource for
//!   this replica, raises its fence under the owner's epoch and releases
//!   it; `directory.rs` puts each replica's address in etcd, for forwarding,
//!   and notices when a replica's lease ends; `incarnation.rs` ends what
//!   the data directory's previous process left in etcd. Without owners
//!   (`ownership = false`): the admission transaction (`keys.rs`, which
//!   also names every key), grouped with others (`batch.rs`), and the
//!   cross-replica wait (`wait.rs`). In both: the replica's lease
//!   (`lease.rs`), the watch, deletion and sweep tasks (`background.rs`),
//!   and the fences and upload tokens as a `FenceTable` (`table.rs`).
//! - [`fence::table`]: `FenceTable`, and its redb implementation
//!   (`fences.redb`, through [`redb_file`]), a single node's.
//!
//! The S3 front (→ fence, body, config, metric_names, utc):
//!
//! - [`s3::op`]: which operation a request is, which ones are fenced writes;
//!   `op/tests.rs`: its classification table and the requests it refuses.
//! - [`s3::names`]: bucket names, keys and copy sources in the one form that
//!   is fenced and forwarded.
//! - [`s3::auth`]: SigV4 verification, header and presigned, step by step;
//!   [`s3::sigv4`]: its primitives (canonical forms, timestamps, hex);
//!   [`s3::signing_key`]: the signing key, its HMAC and the cache that
//!   keeps the day's key and the second's begun signature;
//!   [`s3::sign`]: the same forms signing what fencegate sends the backend;
//!   `auth/tests.rs`: the tests of `s3::auth`.
//! - [`s3::query`], [`s3::headers`]: the query string's one lookup, the
//!   `x-amz-*` header names spelt once.
//! - [`s3::chunked`]: aws-chunked decoding, chunk and trailer signatures.
//! - [`s3::body`]: SHA-256 check, re-chunking for the backend.
//! - [`s3::multi_delete`]: the keys of a DeleteObjects body, and their
//!   conditions.
//! - [`s3::range`]: a read's `Range`, read once and forwarded in one form.
//! - [`s3::session`]: session credentials that carry a fencing token:
//!   issued at the admin API, verified in `auth.rs` with no lookup.
//! - [`s3::conditions`]: a write's `If-None-Match` / `If-Match` / delete
//!   conditions, read once, and AWS's verdict on an object.
//! - [`s3::bucket_config`]: CreateBucket's body, its location constraint
//!   rewritten for the backend's region.
//! - [`s3::xml`]: the backend's XML answers fencegate reads.
//! - [`s3::error`]: one error enum, rendered as S3 XML in one place.
//!
//! The backend (→ s3, store, body, tls, metric_names, per_thread):
//!
//! - [`upstream::client`]: forwarding over hyper, re-signed by `s3::sign`,
//!   or in-process to the embedded store; [`upstream::pool`]: the kept
//!   connections to the backend (a list a serving thread), and the body
//!   sent on them.
//! - [`upstream::embedded`]: the embedded store called in-process, the
//!   default backend (and served alone on a socket for `bench store`);
//!   [`upstream::plain_read`]: its plain GETs and HEADs, answered without
//!   s3s.
//! - [`upstream::target`] (a leaf): where and as whom fencegate reaches the
//!   backend. Within `upstream` the files depend one way: `probe` on
//!   `client`, `client` on `embedded`, `pool` and `target`, `embedded` on
//!   `plain_read` and `target`.
//! - [`upstream::probe`]: whether the backend honours conditional writes
//!   itself (shown on `/readyz`).
//!
//! The embedded store (→ redb_file, metric_names, s3: the header names
//! of `s3::headers`), fencegate's own default
//! backend behind s3s's `S3` trait:
//!
//! - [`store`]: the index in redb (`index.rs`), the blob files
//!   (`blobs.rs`, the small reads' open files kept in `open_blobs.rs`),
//!   the group commit where every change and its conditions
//!   are one step (`commit.rs`), and the S3 operations (`buckets.rs`,
//!   `objects.rs`, `read.rs` (its tests in `read_tests.rs`), `delete.rs`, `copy.rs`, `multipart.rs`,
//!   `listing.rs`, `acl.rs`; `s3.rs` is the trait); `save.rs` is the one
//!   path of a body into a blob (PutObject's, UploadPart's,
//!   UploadPartCopy's), hashed as `digests.rs` says and checked against
//!   what its request declared;
//!   `conditions.rs` a write's `If-None-Match` / `If-Match`; `checksums.rs`
//!   a multipart object's checksums; `import.rs` brings in an s3s-fs data
//!   directory.
//! - [`redb_file`] (a leaf): a redb file reopened by itself after a disk
//!   error, for the store's index and the fence table.
//!
//! A request's life (→ fence, s3, upstream, access_log, body, config,
//! metric_names, tls):
//!
//! - [`proxy`]: the phases of a request, each a function from what the
//!   phases before it established to what it establishes, one error exit,
//!   one log event (what `RequestCtx` collects), a file a phase (the table
//!   in `proxy/mod.rs`): `head.rs` (size, signature, operation,
//!   permission), `token.rs`, `route.rs` (here, at the owner, or at a
//!   peer), `admit_here.rs` (the admission here, and what it does to the
//!   writes in doubt), `conditional.rs` (the object's hold and a write's
//!   conditions, and the condition `fence.conditional_writes` sends),
//!   `in_doubt.rs` (the write's slot in the landing record, and the looks
//!   at the objects of writes in doubt), `outgoing.rs` (the upstream
//!   request and its body pipeline) with `per_op.rs` (what one operation
//!   adds, in one `match`), `forward.rs` (the exchange, keeping the
//!   permits and object hold until the answer is complete), `respond.rs`
//!   (the answer, and what fencegate learns from it). Beside them:
//!   `etags.rs` keeps the ETag fencegate's conditioned writes left each
//!   object;
//!   `to_owner.rs` sends a request to the replica owning its resource, or
//!   relays it to a peer; `peers.rs` keeps the other replicas'
//!   connections and the pings that end forwards to one that stopped
//!   answering; `copy.rs` and `multi_delete.rs` are CopyObject and
//!   DeleteObjects; `public.rs` forwards CORS preflights and anonymous
//!   reads unsigned; `small_body.rs` reads and rewrites the bodies read
//!   whole.
//!
//! Around it:
//!
//! - [`admin`] (→ fence, s3, upstream, store, body, config, metric_names):
//!   health, readiness, fences, manual raise, session credentials,
//!   `/metrics` (`admin::metrics` installs the recorder); `admin::client`
//!   is `fencegate fences ...`; `admin::transfer` is `fences export` and
//!   `import`.
//! - [`locks`] (→ access, fence, config, metric_names): etcd, ZooKeeper, Redis and PostgreSQL, the
//!   token sources known by name, each a lock, its token and a watch of
//!   its holder (`etcd.rs`, `zookeeper.rs`, `redis.rs`, `postgres.rs`);
//!   `watch.rs` is the one loop those watches run in (connect, follow,
//!   back off, log); `helper.rs` is `fencegate lock`; `endpoint.rs` its
//!   `--credentials-endpoint` (credentials served as the AWS container
//!   credentials, renewed while the lock is held); `eager.rs` raises a
//!   fence when its lock's holder goes; `issued.rs` says whether a token
//!   that would raise a verified resource's fence is its lock holder's.
//! - [`workers`] (→ per_thread): the serving threads, one a core by
//!   default, each a single-threaded runtime serving the connections
//!   `server` hands it, with its own list in the upstream pool.
//! - [`shutdown`]: the graceful shutdown's signal, and the future each
//!   connection is served in, which polls that signal only when it fired.
//! - [`connection`] (→ proxy, shutdown, workers, metric_names): one S3
//!   connection on its serving thread: TLS, then HTTP/1 into
//!   `Proxy::handle`.
//! - [`server`] (→ everything above): start-up (fence table, gate, backend,
//!   services) apart from serving (listener, connection limit, the handler
//!   that gives each connection its serving thread, graceful shutdown).
//! - [`cli`] (→ config, bench): flags and config overrides; `main.rs` is
//!   thin: CLI, config, logging, run.
//! - [`bench`](mod@bench) (→ s3, config, store, upstream, tls): `fencegate
//!   bench`, the measuring tools of BENCHMARKS.md: the SigV4 load generator
//!   (`load.rs`), the discarding S3 sink (`sink.rs`), the embedded store
//!   alone (`store.rs`), the forwarding hop's floor (`relay.rs`), the
//!   report (`report.rs`).
//!
//! Outside `src/`: `benches/gate.rs` (criterion: checks, admission, durable
//! raise), `benches/sigv4.rs` (criterion: every SigV4 step beside
//! aws-sigv4), `examples/resource_memory.rs` (memory per resource),
//! `examples/floor_proxy.rs` (the floor of a proxied request), `tests/`
//! (one file per area, `docs/testing.md` says what each covers; `common/`
//! runs fencegate, Garage, moto, etcd, ZooKeeper, Redis, PostgreSQL and a
//! raw SigV4 client;
//! `torture.rs` and `torture/` are the torture harness) and
//! `tests/smoke/smoke.py` (unmodified clients: aws CLI, boto3, rclone,
//! s3cmd).
//!
//! The fence table sits behind `FenceTable`: redb (`fences.redb`) on a
//! single node, etcd in cluster mode (`fence/cluster/table.rs`). Only a
//! single node's gate raises through it. In cluster mode the gate makes
//! its raises in etcd itself (`fence/gate/owned.rs`,
//! `fence/gate/cluster.rs`) and only reads fences through the table,
//! which also serves the admin API's listing, `fences import` and the
//! multipart uploads' tokens.

pub mod access;
pub mod access_log;
pub mod admin;
pub mod bench;
pub mod body;
pub mod cli;
pub mod config;
pub mod connection;
pub mod fence;
pub mod locks;
pub mod log_buffer;
pub mod metric_names;
pub mod per_thread;
pub mod proxy;
pub mod redb_file;
pub mod s3;
pub mod server;
pub mod shutdown;
pub mod store;
pub mod tls;
pub mod upstream;
pub mod utc;
pub mod workers;
