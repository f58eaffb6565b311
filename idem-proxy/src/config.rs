//! The proxy's settings: command-line flags, their environment variables and a TOML file
//! (flags and variables win over the file), merged into the effective [`Settings`], which
//! `--check-config` prints.

pub use crate::choices::{Abandoned, Fingerprint, KeyMode};
use crate::principal::{Jwt, JwtKey, PrincipalSource};
use clap::Parser;
use http::{HeaderName, Method};
use serde::{Deserialize, Deserializer};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The command line (each flag also reads the environment variable it names).
#[derive(Parser, Debug, Default)]
#[command(
    name = "idem-proxy",
    version,
    about = "A reverse proxy that makes the POST and PATCH requests of any HTTP service idempotent by their Idempotency-Key"
)]
pub struct Cli {
    /// A TOML file with these settings and per-route ones (`[[route]]` tables); flags and environment
    /// variables override it.
    #[arg(long, env = "IDEM_PROXY_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Prints the effective settings of FILE (with the flags and environment) and exits: 0 when
    /// they are valid, 2 with the error (and its line) when not.
    #[arg(long, value_name = "FILE")]
    pub check_config: Option<PathBuf>,
    /// The address to serve on.
    #[arg(long, env = "IDEM_PROXY_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// The service behind the proxy: http://HOST:PORT.
    #[arg(long, env = "IDEM_PROXY_UPSTREAM", value_name = "URL")]
    pub upstream: Option<String>,
    /// The idempotency store: memory, sqlite://FILE, postgres://…, mysql://…, redis://…,
    /// redis+cluster://HOST:PORT,HOST:PORT, dynamodb://TABLE.
    #[arg(long, env = "IDEM_PROXY_STORE", value_name = "URL")]
    pub store: Option<String>,
    /// A second listener for /metrics (Prometheus) and /healthz.
    #[arg(long, env = "IDEM_PROXY_ADMIN_LISTEN", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// The request header whose value is the principal (e.g. authorization); the value is
    /// digested, never stored or logged.
    #[arg(long, env = "IDEM_PROXY_PRINCIPAL_HEADER", value_name = "NAME")]
    pub principal_header: Option<String>,
    /// The principal is the `sub` of a bearer JWT signed with HS256 under the secret in FILE.
    #[arg(long, env = "IDEM_PROXY_JWT_SECRET_FILE", value_name = "FILE")]
    pub jwt_secret_file: Option<PathBuf>,
    /// The principal is the `sub` of a bearer JWT signed with RS256 under the PEM public key in
    /// FILE.
    #[arg(long, env = "IDEM_PROXY_JWT_PUBLIC_KEY_FILE", value_name = "FILE")]
    pub jwt_public_key_file: Option<PathBuf>,
    /// The principal is the `sub` of a bearer JWT signed (RS256) under a key of the JWKS in FILE.
    #[arg(long, env = "IDEM_PROXY_JWT_JWKS_FILE", value_name = "FILE")]
    pub jwt_jwks_file: Option<PathBuf>,
    /// The `iss` a JWT must have.
    #[arg(long, env = "IDEM_PROXY_JWT_ISSUER")]
    pub jwt_issuer: Option<String>,
    /// The `aud` a JWT must have.
    #[arg(long, env = "IDEM_PROXY_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Requests without a principal share one anonymous scope.
    #[arg(long, env = "IDEM_PROXY_ALLOW_ANONYMOUS", num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub allow_anonymous: Option<bool>,
    /// At most N keyed requests run upstream at once (beyond: 503 with Retry-After).
    #[arg(long, env = "IDEM_PROXY_MAX_IN_FLIGHT", value_name = "N")]
    pub max_in_flight: Option<usize>,
    /// The largest keyed request body, in bytes (default 1 MiB; above: 413).
    #[arg(long, env = "IDEM_PROXY_BODY_LIMIT", value_name = "BYTES")]
    pub body_limit: Option<usize>,
    /// The largest response stored, in bytes (a larger one is passed on, not stored, and its
    /// key released; default 1 MiB).
    #[arg(long, env = "IDEM_PROXY_RESPONSE_LIMIT", value_name = "BYTES")]
    pub response_limit: Option<usize>,
    /// Whether keyed routes require the key: required or optional (default required).
    #[arg(long, env = "IDEM_PROXY_KEY", value_name = "MODE")]
    pub key: Option<String>,
    /// How long a stored response is replayed (default 24h).
    #[arg(long, env = "IDEM_PROXY_TTL", value_name = "DURATION")]
    pub ttl: Option<String>,
    /// How long a request's claim lives without renewal (default 30s).
    #[arg(long, env = "IDEM_PROXY_LEASE", value_name = "DURATION")]
    pub lease: Option<String>,
    /// raw (default) or canonical (JSON bodies compared by value).
    #[arg(long, env = "IDEM_PROXY_FINGERPRINT", value_name = "MODE")]
    pub fingerprint: Option<String>,
    /// What a request does when it takes over an abandoned attempt (the proxy died mid-request):
    /// rerun (default: send it upstream again) or park (423 until an operator resolves the key).
    #[arg(long, env = "IDEM_PROXY_ON_ABANDONED", value_name = "CHOICE")]
    pub on_abandoned: Option<String>,
    /// How long the upstream has to answer (default 60s; then 504 and the key released).
    #[arg(long, env = "IDEM_PROXY_UPSTREAM_TIMEOUT", value_name = "DURATION")]
    pub upstream_timeout: Option<String>,
    /// How long a SIGTERM waits for requests still running upstream (default 30s).
    #[arg(long, env = "IDEM_PROXY_SHUTDOWN_TIMEOUT", value_name = "DURATION")]
    pub shutdown_timeout: Option<String>,
}

/// A duration as written in the file (`"30s"`, `"24h"`, `"7d"`), checked while parsing so that
/// a bad one is reported at its line.
#[derive(Debug, Clone, Copy)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        duration(&s).map(Dur).map_err(serde::de::Error::custom)
    }
}

fn duration(s: &str) -> Result<Duration, String> {
    match idem::parse_duration(s) {
        Ok(d) if d.is_zero() => Err(format!("duration `{s}` is zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// A method as written.
#[derive(Debug, Clone)]
struct Meth(Method);

impl<'de> Deserialize<'de> for Meth {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        method(&s).map(Meth).map_err(serde::de::Error::custom)
    }
}

fn method(s: &str) -> Result<Method, String> {
    let upper = s.trim().to_ascii_uppercase();
    Method::from_bytes(upper.as_bytes()).map_err(|_| format!("`{s}` is not an HTTP method"))
}

/// A route's path prefix as written: it starts with `/`.
#[derive(Debug, Clone)]
struct PathPrefix(String);

impl<'de> Deserialize<'de> for PathPrefix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if !s.starts_with('/') {
            return Err(serde::de::Error::custom(format!(
                "path `{s}` must start with /"
            )));
        }
        Ok(PathPrefix(s))
    }
}

/// One method or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Methods {
    One(Meth),
    Many(Vec<Meth>),
}

impl Methods {
    fn into_vec(self) -> Vec<Method> {
        match self {
            Methods::One(m) => vec![m.0],
            Methods::Many(ms) => ms.into_iter().map(|m| m.0).collect(),
        }
    }
}

/// The `[jwt]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct JwtFile {
    secret_file: Option<PathBuf>,
    public_key_file: Option<PathBuf>,
    jwks_file: Option<PathBuf>,
    issuer: Option<String>,
    audience: Option<String>,
}

/// One `[[route]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteFile {
    #[serde(alias = "methods")]
    method: Option<Methods>,
    path: PathPrefix,
    key: Option<KeyMode>,
    ttl: Option<Dur>,
    lease: Option<Dur>,
    fingerprint: Option<Fingerprint>,
    on_abandoned: Option<Abandoned>,
}

/// The file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    upstream: Option<String>,
    store: Option<String>,
    admin_listen: Option<String>,
    principal_header: Option<String>,
    allow_anonymous: Option<bool>,
    max_in_flight: Option<usize>,
    body_limit: Option<usize>,
    response_limit: Option<usize>,
    upstream_timeout: Option<Dur>,
    shutdown_timeout: Option<Dur>,
    #[serde(alias = "method")]
    methods: Option<Methods>,
    key: Option<KeyMode>,
    ttl: Option<Dur>,
    lease: Option<Dur>,
    fingerprint: Option<Fingerprint>,
    on_abandoned: Option<Abandoned>,
    jwt: Option<JwtFile>,
    #[serde(default)]
    route: Vec<RouteFile>,
}

/// What applies to the keyed requests of a route.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// The methods under a key.
    pub methods: Vec<Method>,
    /// Whether the key is required.
    pub key: KeyMode,
    /// How long a response is replayed (`None`: the store's default, 24 h).
    pub ttl: Option<Duration>,
    /// The claim's lease (`None`: the store's default, 30 s).
    pub lease: Option<Duration>,
    /// How requests are fingerprinted.
    pub fingerprint: Fingerprint,
    /// What a request that takes over an abandoned attempt does.
    pub on_abandoned: Abandoned,
}

/// A `[[route]]`: a method set and a path prefix, and its settings.
#[derive(Debug, Clone)]
pub struct Route {
    /// The path prefix (whole segments: `/pay` is not a prefix of `/payments`).
    pub path: String,
    /// The settings, the defaults where the route says nothing.
    pub settings: RouteSettings,
}

impl Route {
    /// Whether `path` is under this route's prefix.
    pub fn matches(&self, path: &str) -> bool {
        let Some(rest) = path.strip_prefix(self.path.as_str()) else {
            return false;
        };
        rest.is_empty() || self.path.ends_with('/') || rest.starts_with('/')
    }
}

/// The upstream's address.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// As given.
    pub url: String,
    /// Its authority (`HOST:PORT`).
    pub authority: http::uri::Authority,
}

/// The effective settings.
#[derive(Debug)]
pub struct Settings {
    /// Where the proxy serves.
    pub listen: SocketAddr,
    /// The service behind it.
    pub upstream: Upstream,
    /// The store URL (never printed: it may hold a password).
    pub store: String,
    /// The admin listener.
    pub admin_listen: Option<SocketAddr>,
    /// Where the principal comes from.
    pub principal: PrincipalSource,
    /// Whether requests without a principal share an anonymous scope.
    pub allow_anonymous: bool,
    /// Keyed requests running upstream at once, at most.
    pub max_in_flight: Option<usize>,
    /// The largest keyed request body.
    pub body_limit: usize,
    /// The largest response stored.
    pub response_limit: usize,
    /// How long the upstream has to answer.
    pub upstream_timeout: Duration,
    /// How long a SIGTERM waits for requests running upstream.
    pub shutdown_timeout: Duration,
    /// What applies where no route matches.
    pub defaults: RouteSettings,
    /// The routes, longest prefix first.
    pub routes: Vec<Route>,
}

/// A configuration error: its message (with the file's line where it has one).
#[derive(Debug)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

fn parse_file(path: &std::path::Path) -> Result<File, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| {
            text.as_bytes()[..s.start.min(text.len())]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1
        });
        let msg = e.message().trim_end();
        match line {
            Some(line) => ConfigError(format!("{}:{line}: {msg}", path.display())),
            None => ConfigError(format!("{}: {msg}", path.display())),
        }
    })
}

fn addr(what: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        ConfigError(format!(
            "{what} `{s}` is not an address such as 127.0.0.1:8080"
        ))
    })
}

fn upstream(s: &str) -> Result<Upstream, ConfigError> {
    let uri: http::Uri = s.parse().map_err(|_| {
        ConfigError(format!(
            "upstream `{s}` is not a URL such as http://127.0.0.1:3000"
        ))
    })?;
    if uri.scheme_str() != Some("http") {
        return err(format!(
            "upstream `{s}`: only http:// upstreams are supported (the proxy runs beside the service)"
        ));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return err(format!("upstream `{s}`: give HOST:PORT without a path"));
    }
    let authority = uri
        .authority()
        .cloned()
        .ok_or_else(|| ConfigError(format!("upstream `{s}` has no host")))?;
    Ok(Upstream {
        url: s.to_owned(),
        authority,
    })
}

fn from_flag<T>(
    what: &str,
    flag: &Option<String>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, ConfigError> {
    flag.as_deref()
        .map(|s| parse(s).map_err(|e| ConfigError(format!("--{what}: {e}"))))
        .transpose()
}

impl Settings {
    /// The effective settings of `cli` over the file it names (`--config`, or the
    /// `--check-config` file).
    pub fn load(cli: &Cli) -> Result<Settings, ConfigError> {
        let path = cli.check_config.as_ref().or(cli.config.as_ref());
        let file = match path {
            Some(p) => parse_file(p)?,
            None => File::default(),
        };
        let listen = cli.listen.clone().or(file.listen);
        let listen = addr("listen", listen.as_deref().unwrap_or("127.0.0.1:8080"))?;
        let Some(up) = cli.upstream.clone().or(file.upstream) else {
            return err(
                "no upstream: give --upstream http://HOST:PORT (or `upstream` in the file)",
            );
        };
        let upstream = upstream(&up)?;
        let Some(store) = cli.store.clone().or(file.store) else {
            return err(format!(
                "no store: give --store URL (or `store` in the file): {}",
                crate::store::FORMS
            ));
        };
        crate::store::check(&store).map_err(|e| ConfigError(format!("store: {e}")))?;
        let admin_listen = cli
            .admin_listen
            .clone()
            .or(file.admin_listen)
            .map(|a| addr("admin-listen", &a))
            .transpose()?;
        if listen.port() != 0 && admin_listen == Some(listen) {
            return err("admin-listen must differ from listen");
        }
        let allow_anonymous = cli
            .allow_anonymous
            .or(file.allow_anonymous)
            .unwrap_or(false);
        let jwt_file = file.jwt.unwrap_or_default();
        let principal = principal(
            cli.principal_header.clone().or(file.principal_header),
            JwtFile {
                secret_file: cli.jwt_secret_file.clone().or(jwt_file.secret_file),
                public_key_file: cli.jwt_public_key_file.clone().or(jwt_file.public_key_file),
                jwks_file: cli.jwt_jwks_file.clone().or(jwt_file.jwks_file),
                issuer: cli.jwt_issuer.clone().or(jwt_file.issuer),
                audience: cli.jwt_audience.clone().or(jwt_file.audience),
            },
            allow_anonymous,
        )?;
        let max_in_flight = cli.max_in_flight.or(file.max_in_flight);
        if max_in_flight == Some(0) {
            return err("max_in_flight must be at least 1");
        }
        let body_limit = cli.body_limit.or(file.body_limit).unwrap_or(1 << 20);
        let response_limit = cli
            .response_limit
            .or(file.response_limit)
            .unwrap_or(1 << 20);
        let upstream_timeout = from_flag("upstream-timeout", &cli.upstream_timeout, duration)?
            .or(file.upstream_timeout.map(|d| d.0))
            .unwrap_or(Duration::from_secs(60));
        let shutdown_timeout = from_flag("shutdown-timeout", &cli.shutdown_timeout, duration)?
            .or(file.shutdown_timeout.map(|d| d.0))
            .unwrap_or(Duration::from_secs(30));
        let defaults = RouteSettings {
            methods: file
                .methods
                .map(Methods::into_vec)
                .unwrap_or_else(|| vec![Method::POST, Method::PATCH]),
            key: from_flag("key", &cli.key, str::parse)?
                .or(file.key)
                .unwrap_or(KeyMode::Required),
            ttl: from_flag("ttl", &cli.ttl, duration)?.or(file.ttl.map(|d| d.0)),
            lease: from_flag("lease", &cli.lease, duration)?.or(file.lease.map(|d| d.0)),
            fingerprint: from_flag("fingerprint", &cli.fingerprint, str::parse)?
                .or(file.fingerprint)
                .unwrap_or(Fingerprint::Raw),
            on_abandoned: from_flag("on-abandoned", &cli.on_abandoned, str::parse)?
                .or(file.on_abandoned)
                .unwrap_or(Abandoned::Rerun),
        };
        let mut routes: Vec<Route> = file
            .route
            .into_iter()
            .map(|r| Route {
                path: r.path.0,
                settings: RouteSettings {
                    methods: r
                        .method
                        .map(Methods::into_vec)
                        .unwrap_or_else(|| defaults.methods.clone()),
                    key: r.key.unwrap_or(defaults.key),
                    ttl: r.ttl.map(|d| d.0).or(defaults.ttl),
                    lease: r.lease.map(|d| d.0).or(defaults.lease),
                    fingerprint: r.fingerprint.unwrap_or(defaults.fingerprint),
                    on_abandoned: r.on_abandoned.unwrap_or(defaults.on_abandoned),
                },
            })
            .collect();
        // the longest prefix first: the first match is the most specific
        routes.sort_by_key(|r| std::cmp::Reverse(r.path.len()));
        Ok(Settings {
            listen,
            upstream,
            store,
            admin_listen,
            principal,
            allow_anonymous,
            max_in_flight,
            body_limit,
            response_limit,
            upstream_timeout,
            shutdown_timeout,
            defaults,
            routes,
        })
    }

    /// The settings as `--check-config` prints them (the store URL without its password).
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "listen            {}", self.listen);
        let _ = writeln!(out, "upstream          {}", self.upstream.url);
        let _ = writeln!(out, "store             {}", redact(&self.store));
        let admin = self
            .admin_listen
            .map_or("(none)".to_owned(), |a| a.to_string());
        let _ = writeln!(out, "admin-listen      {admin}");
        let _ = writeln!(out, "principal         {}", self.principal.describe());
        let _ = writeln!(out, "allow-anonymous   {}", self.allow_anonymous);
        let mif = self
            .max_in_flight
            .map_or("(no bound)".to_owned(), |n| n.to_string());
        let _ = writeln!(out, "max-in-flight     {mif}");
        let _ = writeln!(out, "body-limit        {} bytes", self.body_limit);
        let _ = writeln!(out, "response-limit    {} bytes", self.response_limit);
        let _ = writeln!(out, "upstream-timeout  {:?}", self.upstream_timeout);
        let _ = writeln!(out, "shutdown-timeout  {:?}", self.shutdown_timeout);
        let _ = writeln!(out, "routes (longest prefix first; then the defaults):");
        for r in &self.routes {
            let _ = writeln!(out, "  {:<16} {}", r.path, describe_route(&r.settings));
        }
        let _ = writeln!(
            out,
            "  {:<16} {}",
            "(any other)",
            describe_route(&self.defaults)
        );
        out
    }
}

fn describe_route(s: &RouteSettings) -> String {
    let methods: Vec<&str> = s.methods.iter().map(Method::as_str).collect();
    let d = |d: Option<Duration>, default: &str| {
        d.map_or(format!("{default} (default)"), |d| format!("{d:?}"))
    };
    format!(
        "methods={} key={:?} ttl={} lease={} fingerprint={:?} on_abandoned={:?}",
        methods.join(","),
        s.key,
        d(s.ttl, "24h"),
        d(s.lease, "30s"),
        s.fingerprint,
        s.on_abandoned
    )
    .to_lowercase()
}

/// `url` without the password of its user info.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (auth, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match auth.rsplit_once('@') {
        Some((user, host)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or_default();
            format!("{scheme}://{name}:***@{host}{tail}")
        }
        _ => url.to_owned(),
    }
}

fn principal(
    header: Option<String>,
    jwt: JwtFile,
    allow_anonymous: bool,
) -> Result<PrincipalSource, ConfigError> {
    let keys = [
        jwt.secret_file.is_some(),
        jwt.public_key_file.is_some(),
        jwt.jwks_file.is_some(),
    ]
    .iter()
    .filter(|k| **k)
    .count();
    if keys > 1 {
        return err(
            "give one JWT key: a secret file (HS256), a public key file (RS256) or a JWKS file",
        );
    }
    if keys == 1 && header.is_some() {
        return err("give --principal-header or a JWT key, not both");
    }
    if let Some(name) = header {
        let name = HeaderName::from_bytes(name.trim().as_bytes())
            .map_err(|_| ConfigError(format!("principal-header `{name}` is not a header name")))?;
        return Ok(PrincipalSource::Header(name));
    }
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| ConfigError(format!("{}: cannot read: {e}", p.display())))
    };
    let key = if let Some(p) = &jwt.secret_file {
        let mut secret = read(p)?;
        while secret.last().is_some_and(|b| b.is_ascii_whitespace()) {
            secret.pop();
        }
        if secret.len() < 32 {
            return err(format!(
                "{}: an HS256 secret of fewer than 32 bytes is guessable",
                p.display()
            ));
        }
        Some(JwtKey::hs256(&secret))
    } else if let Some(p) = &jwt.public_key_file {
        Some(
            JwtKey::rs256_pem(&read(p)?)
                .map_err(|e| ConfigError(format!("{}: {e}", p.display())))?,
        )
    } else if let Some(p) = &jwt.jwks_file {
        Some(JwtKey::jwks(&read(p)?).map_err(|e| ConfigError(format!("{}: {e}", p.display())))?)
    } else {
        None
    };
    if let Some(key) = key {
        return Ok(PrincipalSource::Jwt(Jwt::new(
            key,
            jwt.issuer,
            jwt.audience,
        )));
    }
    if allow_anonymous {
        return Ok(PrincipalSource::Anonymous);
    }
    err("no principal: keys must be scoped by who sends them, or one client could replay another's \
         response. Give --principal-header NAME (e.g. authorization), a JWT key \
         (--jwt-secret-file, --jwt-public-key-file or --jwt-jwks-file), or --allow-anonymous \
         if every client is one party")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
