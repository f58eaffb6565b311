//! `idem check URL`: a black-box check of any HTTP API's idempotency, from the outside: the same
//! key twice, the same key with another body, concurrent duplicates, a client that hangs up
//! then retries, one key under two principals. Each check passes or fails with its evidence.

use crate::failure::Failure;
use clap::Args;
use futures_util::future::join_all;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use reqwest::{Client, Method, StatusCode};
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// Exit code: at least one check failed.
pub(crate) const CHECK_FAILED: u8 = 6;

/// `idem check URL`.
#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// The operation to check: an http:// URL that takes a request with an Idempotency-Key
    pub(crate) target: String,
    /// The method of the operation
    #[arg(long, short = 'X', default_value = "POST")]
    pub(crate) method: String,
    /// The request body
    #[arg(long, short = 'd', default_value = r#"{"amount":100}"#)]
    pub(crate) data: String,
    /// Another request body, for the same key with another body
    #[arg(long, default_value = r#"{"amount":200}"#)]
    pub(crate) other_data: String,
    /// The Content-Type of the bodies
    #[arg(long, default_value = "application/json")]
    pub(crate) content_type: String,
    /// A header on every request ("Name: value"); repeat for more
    #[arg(long = "header", short = 'H', value_name = "HEADER")]
    pub(crate) headers: Vec<String>,
    /// A principal's credential header ("Authorization: Bearer …"); give two for the
    /// two-principal check (the first is used by the other checks)
    #[arg(long = "as", value_name = "HEADER")]
    pub(crate) principals: Vec<String>,
    /// A URL whose GET body holds the number of effects made so far (a JSON number, or an
    /// object with a `count` or `runs` number): the checks then count effects, and the hang-up
    /// check runs
    #[arg(long, value_name = "URL")]
    pub(crate) count_url: Option<String>,
    /// How long the hang-up check's client waits before it closes its connection
    #[arg(long, value_parser = parse_duration, default_value = "100ms")]
    pub(crate) hang_up_after: Duration,
    /// Concurrent duplicates sent at once
    #[arg(long, default_value_t = 5)]
    pub(crate) concurrency: usize,
    /// How long one request may take
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    pub(crate) timeout: Duration,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    idem::parse_duration(s).map_err(|e| e.to_string())
}

/// A check's verdict.
#[derive(Serialize, Clone, Copy, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
enum Verdict {
    Pass,
    Fail,
    Skip,
}

/// One check: its name, verdict and evidence.
#[derive(Serialize, Debug)]
struct Outcome {
    check: &'static str,
    result: Verdict,
    evidence: String,
}

/// The report.
#[derive(Serialize, Debug)]
struct Report {
    target: String,
    passed: bool,
    checks: Vec<Outcome>,
}

/// A response, as far as the checks look at it.
#[derive(Debug, Clone)]
struct Seen {
    status: StatusCode,
    replayed: bool,
    retry_after: Option<String>,
    body: String,
}

impl Seen {
    fn brief(&self) -> String {
        let mut s = self.status.as_u16().to_string();
        if self.replayed {
            s.push_str(" (replayed)");
        }
        if let Some(r) = &self.retry_after {
            let _ = write!(s, " (Retry-After: {r})");
        }
        s
    }
}

struct Checker {
    client: Client,
    args: CheckArgs,
    method: Method,
    base: HeaderMap,
    run: String,
}

fn header(line: &str) -> Result<(HeaderName, HeaderValue), Failure> {
    let (name, value) = line
        .split_once(':')
        .ok_or_else(|| Failure::usage(format!("header `{line}` is not `Name: value`")))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| Failure::usage(format!("`{}` is not a header name", name.trim())))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| Failure::usage(format!("the value of `{name}` is not a header value")))?;
    Ok((name, value))
}

/// Runs the checks; prints the report. A failed check exits with [`CHECK_FAILED`] here, after
/// the report: the report is the command's output, in table or JSON form alike.
pub(crate) async fn run(args: CheckArgs, json: bool) -> Result<String, Failure> {
    let url = reqwest::Url::parse(&args.target)
        .map_err(|e| Failure::usage(format!("`{}` is not a URL: {e}", args.target)))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Failure::usage("the URL must be http:// or https://"));
    }
    if args.principals.len() > 2 {
        return Err(Failure::usage("give --as at most twice"));
    }
    let method = Method::from_bytes(args.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| Failure::usage(format!("`{}` is not a method", args.method)))?;
    let mut base = HeaderMap::new();
    for h in &args.headers {
        let (n, v) = header(h)?;
        base.append(n, v);
    }
    let ct = HeaderValue::from_str(&args.content_type)
        .map_err(|_| Failure::usage("--content-type is not a header value"))?;
    base.insert(CONTENT_TYPE, ct);
    for p in &args.principals {
        header(p)?;
    }
    let client = Client::builder()
        .timeout(args.timeout)
        .build()
        .map_err(|e| Failure::usage(format!("cannot make an HTTP client: {e}")))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let checker = Checker {
        client,
        args,
        method,
        base,
        run: format!("idem-check-{}-{nanos}", std::process::id()),
    };
    let checks = vec![
        checker.same_key_twice().await,
        checker.another_body().await,
        checker.concurrent().await,
        checker.hang_up().await,
        checker.two_principals().await,
    ];
    let passed = checks.iter().all(|c| c.result != Verdict::Fail);
    let report = Report {
        target: checker.args.target.clone(),
        passed,
        checks,
    };
    let out = if json {
        let mut s = serde_json::to_string_pretty(&report).unwrap_or_default();
        s.push('\n');
        s
    } else {
        table(&report)
    };
    if !passed {
        use std::io::Write as _;
        let mut stdout = std::io::stdout();
        let _ = stdout.write_all(out.as_bytes());
        let _ = stdout.flush();
        let failed = report
            .checks
            .iter()
            .filter(|c| c.result == Verdict::Fail)
            .count();
        eprintln!("idem: {failed} check(s) failed against {}", report.target);
        std::process::exit(CHECK_FAILED.into());
    }
    Ok(out)
}

fn table(report: &Report) -> String {
    let mut s = format!("idem check {}\n\n", report.target);
    let _ = writeln!(s, "{:<16} {:<6} EVIDENCE", "CHECK", "RESULT");
    for c in &report.checks {
        let result = match c.result {
            Verdict::Pass => "pass",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "skip",
        };
        let _ = writeln!(s, "{:<16} {:<6} {}", c.check, result, c.evidence);
    }
    let _ = writeln!(
        s,
        "\n{}",
        if report.passed {
            "idempotent: every check passed"
        } else {
            "NOT idempotent: see the failed checks"
        }
    );
    s
}

fn outcome(check: &'static str, result: Verdict, evidence: impl Into<String>) -> Outcome {
    Outcome {
        check,
        result,
        evidence: evidence.into(),
    }
}

impl Checker {
    fn key(&self, check: &str) -> String {
        format!("\"{}-{check}\"", self.run)
    }

    fn request(&self, key: &str, body: &str, principal: Option<&str>) -> reqwest::RequestBuilder {
        let mut headers = self.base.clone();
        if let Ok(v) = HeaderValue::from_str(key) {
            headers.insert(HeaderName::from_static("idempotency-key"), v);
        }
        if let Some((n, v)) = principal.and_then(|p| header(p).ok()) {
            headers.insert(n, v);
        }
        self.client
            .request(self.method.clone(), &self.args.target)
            .headers(headers)
            .body(body.to_owned())
    }

    fn first_principal(&self) -> Option<&str> {
        self.args.principals.first().map(String::as_str)
    }

    async fn send(&self, key: &str, body: &str, principal: Option<&str>) -> Result<Seen, String> {
        let res = self
            .request(key, body, principal)
            .send()
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = res.status();
        let replayed = res
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        let retry_after = res
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = res
            .text()
            .await
            .map_err(|e| format!("response body failed: {e}"))?;
        Ok(Seen {
            status,
            replayed,
            retry_after,
            body,
        })
    }

    /// The effects made so far, from --count-url.
    async fn count(&self) -> Result<Option<i64>, String> {
        let Some(url) = &self.args.count_url else {
            return Ok(None);
        };
        let res = self
            .client
            .get(url)
            .headers(self.base.clone())
            .send()
            .await
            .map_err(|e| format!("--count-url failed: {e}"))?;
        let v: serde_json::Value = res
            .json()
            .await
            .map_err(|e| format!("--count-url is not JSON: {e}"))?;
        let n = v
            .as_i64()
            .or_else(|| v.get("count").and_then(|c| c.as_i64()))
            .or_else(|| v.get("runs").and_then(|c| c.as_i64()))
            .ok_or("--count-url has no number, `count` or `runs`")?;
        Ok(Some(n))
    }

    /// The effects a step made (`None` without --count-url): counted after the step settles.
    async fn effects<T>(
        &self,
        step: impl std::future::Future<Output = T>,
    ) -> Result<(T, Option<i64>), String> {
        let before = self.count().await?;
        let out = step.await;
        // effects of requests whose clients left may land a moment after
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after = self.count().await?;
        Ok((out, before.zip(after).map(|(b, a)| a - b)))
    }

    async fn same_key_twice(&self) -> Outcome {
        const NAME: &str = "same-key-twice";
        let key = self.key("twice");
        let p = self.first_principal();
        let step = async {
            let a = self.send(&key, &self.args.data, p).await?;
            let b = self.send(&key, &self.args.data, p).await?;
            Ok::<_, String>((a, b))
        };
        let (pair, effects) = match self.effects(step).await {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let (a, b) = match pair {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let same = a.status == b.status && a.body == b.body;
        let mut evidence = format!(
            "{} then {}; {}",
            a.brief(),
            b.brief(),
            if same {
                "same body"
            } else {
                "different responses"
            }
        );
        if let Some(n) = effects {
            let _ = write!(evidence, "; {n} effect(s)");
        }
        let ok = a.status.is_success() && same && effects.is_none_or(|n| n == 1);
        outcome(
            NAME,
            if ok { Verdict::Pass } else { Verdict::Fail },
            evidence,
        )
    }

    async fn another_body(&self) -> Outcome {
        const NAME: &str = "another-body";
        let key = self.key("other");
        let p = self.first_principal();
        let a = match self.send(&key, &self.args.data, p).await {
            Ok(a) => a,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let b = match self.send(&key, &self.args.other_data, p).await {
            Ok(b) => b,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let ok = a.status.is_success() && b.status == StatusCode::UNPROCESSABLE_ENTITY;
        let evidence = format!(
            "{} then {} for the same key with another body (expected 422)",
            a.brief(),
            b.brief()
        );
        outcome(
            NAME,
            if ok { Verdict::Pass } else { Verdict::Fail },
            evidence,
        )
    }

    async fn concurrent(&self) -> Outcome {
        const NAME: &str = "concurrent";
        let key = self.key("concurrent");
        let p = self.first_principal();
        let n = self.args.concurrency.max(2);
        let step = join_all((0..n).map(|_| self.send(&key, &self.args.data, p)));
        let (all, effects) = match self.effects(step).await {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let mut seen = Vec::new();
        for r in all {
            match r {
                Ok(s) => seen.push(s),
                Err(e) => return outcome(NAME, Verdict::Fail, e),
            }
        }
        let successes: Vec<&Seen> = seen.iter().filter(|s| s.status.is_success()).collect();
        let conflicts_ok = seen
            .iter()
            .filter(|s| s.status == StatusCode::CONFLICT)
            .all(|s| s.retry_after.is_some());
        let others = seen
            .iter()
            .filter(|s| !s.status.is_success() && s.status != StatusCode::CONFLICT)
            .count();
        // every success is one response (the first's, or a wait for it): one body
        let one_body = successes.windows(2).all(|w| w[0].body == w[1].body);
        let statuses: Vec<String> = seen.iter().map(Seen::brief).collect();
        let mut evidence = format!("{n} at once: {}", statuses.join(", "));
        if let Some(e) = effects {
            let _ = write!(evidence, "; {e} effect(s)");
        }
        let ok = !successes.is_empty()
            && one_body
            && conflicts_ok
            && others == 0
            && effects.is_none_or(|e| e == 1);
        outcome(
            NAME,
            if ok { Verdict::Pass } else { Verdict::Fail },
            evidence,
        )
    }

    async fn hang_up(&self) -> Outcome {
        const NAME: &str = "hang-up-retry";
        if self.args.count_url.is_none() {
            return outcome(
                NAME,
                Verdict::Skip,
                "needs --count-url to count the effects",
            );
        }
        let key = self.key("hangup");
        let p = self.first_principal();
        let step = async {
            let hung = tokio::time::timeout(
                self.args.hang_up_after,
                self.request(&key, &self.args.data, p).send(),
            )
            .await;
            let hung_up = hung.is_err();
            // retry until the first attempt is over (409 while it runs)
            let deadline = std::time::Instant::now() + self.args.timeout;
            loop {
                let r = self.send(&key, &self.args.data, p).await?;
                if r.status != StatusCode::CONFLICT || std::time::Instant::now() > deadline {
                    return Ok::<_, String>((hung_up, r));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        let (result, effects) = match self.effects(step).await {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let (hung_up, retry) = match result {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let effects = effects.unwrap_or_default();
        let mut evidence = format!(
            "the client {} after {:?}; the retry got {}; {effects} effect(s)",
            if hung_up { "hung up" } else { "had its answer" },
            self.args.hang_up_after,
            retry.brief()
        );
        if !hung_up {
            evidence
                .push_str(" (the operation answered before the hang-up: a slower one tests more)");
        }
        let ok = retry.status.is_success() && effects == 1;
        outcome(
            NAME,
            if ok { Verdict::Pass } else { Verdict::Fail },
            evidence,
        )
    }

    async fn two_principals(&self) -> Outcome {
        const NAME: &str = "two-principals";
        let [a, b] = self.args.principals.as_slice() else {
            return outcome(NAME, Verdict::Skip, "needs two --as credentials");
        };
        let key = self.key("principals");
        let step = async {
            let first = self.send(&key, &self.args.data, Some(a)).await?;
            let second = self.send(&key, &self.args.data, Some(b)).await?;
            Ok::<_, String>((first, second))
        };
        let (pair, effects) = match self.effects(step).await {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let (first, second) = match pair {
            Ok(x) => x,
            Err(e) => return outcome(NAME, Verdict::Fail, e),
        };
        let mut evidence = format!(
            "one key: {} as the first, {} as the second",
            first.brief(),
            second.brief()
        );
        if let Some(e) = effects {
            let _ = write!(evidence, "; {e} effect(s)");
        }
        // the second principal must not get the first one's response
        let leaked = second.replayed || effects == Some(1);
        if leaked {
            evidence.push_str("; the second principal got the first one's response");
        }
        let ok = first.status.is_success() && second.status.is_success() && !leaked;
        outcome(
            NAME,
            if ok { Verdict::Pass } else { Verdict::Fail },
            evidence,
        )
    }
}
