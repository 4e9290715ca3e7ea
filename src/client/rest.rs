//! The REST calls under `/api/v1` (docs/CLI.md, "What the client speaks").
//!
//! Single resources come wrapped (`{"host":{...}}`) and lists too
//! (`{"hosts":[...]}`); a list with more behind it carries `nextCursor`,
//! which [`Client::list`] follows until the last page, so callers always
//! get the whole list. The audit log is the exception: one answer, as
//! long as its `limit`.

use awc::http::header::HeaderMap;
use awc::http::Method;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use uuid::Uuid;

use super::error::{from_response, from_send};
use super::resources::{
    AuditEvent, AuditFilter, CreatedToken, Host, NewRun, NewTerminal, NewToken, Run, RunLog, Terminal, TerminalFilter,
    Token,
};
use super::{Client, ClientError};

/// Items asked for per page (the API's default; its maximum is 5000).
const PAGE_LIMIT: u32 = 500;

/// Largest body read from one answer: a run's log is at most
/// `runs.log_max_bytes` (4 MiB by default), lists are far smaller.
const MAX_BODY: usize = 256 * 1024 * 1024;

impl Client {
    /// One request; the body of a 2xx answer, else the API's error.
    async fn call<Q: Serialize>(
        &self,
        method: Method,
        path: &str,
        query: Option<&Q>,
        body: Option<&Value>,
    ) -> Result<Bytes, ClientError> {
        self.exchange(method, path, query, body).await.map(|(_, bytes)| bytes)
    }

    /// One request; the headers and body of a 2xx answer, else the API's error.
    async fn exchange<Q: Serialize>(
        &self,
        method: Method,
        path: &str,
        query: Option<&Q>,
        body: Option<&Value>,
    ) -> Result<(HeaderMap, Bytes), ClientError> {
        let url = format!("{}{}", self.server, path);
        let mut request = self.http.request(method, &url).bearer_auth(&self.token);
        if let Some(query) = query {
            request = request.query(query).map_err(|e| ClientError::Encode(e.to_string()))?;
        }
        let sent = match body {
            Some(body) => request.send_json(body).await,
            None => request.send().await,
        };
        let mut response = sent.map_err(|e| from_send(&url, &e))?;
        let bytes = response
            .body()
            .limit(MAX_BODY)
            .await
            .map_err(|e| ClientError::Decode { url: url.clone(), message: e.to_string() })?;
        let status = response.status();
        if !status.is_success() {
            return Err(from_response(&url, status.as_u16(), &bytes));
        }
        Ok((response.headers().clone(), bytes))
    }

    /// `GET path` as JSON, for callers that want the resource exactly as sent.
    pub async fn get_json(&self, path: &str) -> Result<Value, ClientError> {
        let bytes = self.call::<()>(Method::GET, path, None, None).await?;
        decode(&format!("{}{path}", self.server), &bytes)
    }

    async fn send_json(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, ClientError> {
        let bytes = self.call::<()>(method, path, None, body).await?;
        if bytes.is_empty() {
            return Ok(Value::Null);
        }
        decode(&format!("{}{path}", self.server), &bytes)
    }

    /// Every item of a list, following `nextCursor` page by page. `query`
    /// holds the list's filters.
    pub async fn list<T: DeserializeOwned, F: Serialize>(
        &self,
        path: &str,
        key: &str,
        filters: &F,
    ) -> Result<Vec<T>, ClientError> {
        #[derive(Serialize)]
        struct Page<'a, F> {
            #[serde(flatten)]
            filters: &'a F,
            limit: u32,
            #[serde(skip_serializing_if = "Option::is_none")]
            after: Option<&'a str>,
        }
        let url = format!("{}{path}", self.server);
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page = Page { filters, limit: PAGE_LIMIT, after: after.as_deref() };
            let bytes = match self.call(Method::GET, path, Some(&page), None).await {
                Ok(bytes) => bytes,
                // A tether server always has its list routes: a 404 means
                // the base URL points somewhere else (a wrong path prefix).
                Err(ClientError::Api { status: 404, .. }) => {
                    return Err(ClientError::NotTether { url, status: 404 });
                }
                Err(e) => return Err(e),
            };
            let body = decode(&url, &bytes)?;
            items.extend(take_list(&url, &body, key)?);
            match body.get("nextCursor").and_then(Value::as_str) {
                // A cursor that does not move would loop forever.
                Some(next) if Some(next) != after.as_deref() && !next.is_empty() => after = Some(next.to_owned()),
                _ => return Ok(items),
            }
        }
    }

    /// A wrapped single resource (`{"host":{...}}`) from `body`.
    fn unwrap_one<T: DeserializeOwned>(&self, path: &str, key: &str, mut body: Value) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.server);
        match body.get_mut(key).map(Value::take) {
            Some(item) => from_value(&url, item),
            None => Err(ClientError::Decode { url, message: format!("no `{key}` in the answer") }),
        }
    }

    async fn get_one<T: DeserializeOwned>(&self, path: &str, key: &str) -> Result<T, ClientError> {
        let body = self.get_json(path).await?;
        self.unwrap_one(path, key, body)
    }

    // --- hosts ---------------------------------------------------------------

    /// `GET /hosts`: every host of the user, with live state.
    pub async fn hosts(&self) -> Result<Vec<Host>, ClientError> {
        self.list("/api/v1/hosts", "hosts", &()).await
    }

    /// `POST /hosts`: registers a machine (an upsert by hostname), as a
    /// daemon does on its first start.
    pub async fn register_host(
        &self,
        name: &str,
        hostname: &str,
        platform: &str,
        arch: &str,
    ) -> Result<Host, ClientError> {
        let body = json!({ "name": name, "hostname": hostname, "platform": platform, "arch": arch });
        let answer = self.send_json(Method::POST, "/api/v1/hosts", Some(&body)).await?;
        self.unwrap_one("/api/v1/hosts", "host", answer)
    }

    pub async fn host(&self, id: Uuid) -> Result<Host, ClientError> {
        self.get_one(&format!("/api/v1/hosts/{id}"), "host").await
    }

    // --- terminals -------------------------------------------------------------

    pub async fn terminals(&self, filter: &TerminalFilter) -> Result<Vec<Terminal>, ClientError> {
        self.list("/api/v1/terminals", "terminals", filter).await
    }

    pub async fn terminal(&self, id: Uuid) -> Result<Terminal, ClientError> {
        self.get_one(&format!("/api/v1/terminals/{id}"), "terminal").await
    }

    /// `POST /terminals`: created and spawned at once when the host is
    /// online, parked `pending` when it is not.
    pub async fn create_terminal(&self, new: &NewTerminal) -> Result<Terminal, ClientError> {
        let body = serde_json::to_value(new).map_err(|e| ClientError::Encode(e.to_string()))?;
        let answer = self.send_json(Method::POST, "/api/v1/terminals", Some(&body)).await?;
        self.unwrap_one("/api/v1/terminals", "terminal", answer)
    }

    /// `POST /terminals/{id}/kill`: `signal` by name (`TERM`, `SIGKILL`) or
    /// number; `None` is TERM. The terminal stays running until it exits;
    /// the answer is the terminal as the server had it when it sent the signal.
    pub async fn kill_terminal(&self, id: Uuid, signal: Option<&str>) -> Result<Terminal, ClientError> {
        let signal = match signal {
            None => Value::Null,
            Some(s) => s.parse::<u32>().map(Value::from).unwrap_or_else(|_| Value::from(s)),
        };
        let path = format!("/api/v1/terminals/{id}/kill");
        let answer = self.send_json(Method::POST, &path, Some(&json!({ "signal": signal }))).await?;
        self.unwrap_one(&path, "terminal", answer)
    }

    /// `DELETE /terminals/{id}` (refused with `terminal_live` while it runs).
    pub async fn delete_terminal(&self, id: Uuid) -> Result<(), ClientError> {
        self.send_json(Method::DELETE, &format!("/api/v1/terminals/{id}"), None).await.map(drop)
    }

    // --- runs ----------------------------------------------------------------------

    /// `POST /runs`: queued; a worker dispatches it as a terminal.
    pub async fn create_run(&self, new: &NewRun) -> Result<Run, ClientError> {
        let body = serde_json::to_value(new).map_err(|e| ClientError::Encode(e.to_string()))?;
        let answer = self.send_json(Method::POST, "/api/v1/runs", Some(&body)).await?;
        self.unwrap_one("/api/v1/runs", "run", answer)
    }

    pub async fn runs(&self) -> Result<Vec<Run>, ClientError> {
        self.list("/api/v1/runs", "runs", &()).await
    }

    pub async fn run(&self, id: Uuid) -> Result<Run, ClientError> {
        self.get_one(&format!("/api/v1/runs/{id}"), "run").await
    }

    /// `GET /runs/{id}/log`: the captured output so far, bytes as the
    /// terminal produced them.
    pub async fn run_log(&self, id: Uuid) -> Result<Bytes, ClientError> {
        self.run_log_from(id, 0).await.map(|log| log.data)
    }

    /// `GET /runs/{id}/log?from=N`: the captured output from stream offset
    /// `from`, where the log ends so far, and whether it will grow.
    pub async fn run_log_from(&self, id: Uuid, from: u64) -> Result<RunLog, ClientError> {
        let path = format!("/api/v1/runs/{id}/log");
        let (headers, data) = self.exchange(Method::GET, &path, Some(&[("from", from)]), None).await?;
        let url = format!("{}{path}", self.server);
        let header = |name: &str| {
            headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned).ok_or_else(|| ClientError::Decode {
                url: url.clone(),
                message: format!("no {name} header (a server before ?from=)"),
            })
        };
        let next_offset = header("Tether-Next-Offset")?
            .parse()
            .map_err(|_| ClientError::Decode { url: url.clone(), message: "bad Tether-Next-Offset".into() })?;
        let complete = header("Tether-Log-Complete")? == "true";
        Ok(RunLog { from, data, next_offset, complete })
    }

    // --- tokens --------------------------------------------------------------------

    /// `GET /tokens`: the user's tokens, oldest first, revoked and expired
    /// ones included; never a secret. Needs a `full` token.
    pub async fn tokens(&self) -> Result<Vec<Token>, ClientError> {
        self.list("/api/v1/tokens", "tokens", &()).await
    }

    /// `POST /tokens`: the new token and its secret (shown this once).
    pub async fn create_token(&self, new: &NewToken) -> Result<CreatedToken, ClientError> {
        let body = serde_json::to_value(new).map_err(|e| ClientError::Encode(e.to_string()))?;
        let path = "/api/v1/tokens";
        let answer = self.send_json(Method::POST, path, Some(&body)).await?;
        from_value(&format!("{}{path}", self.server), answer)
    }

    /// `DELETE /tokens/{id}`: refused at once from then on, its open
    /// sockets closed 4401. Revoking a revoked token is not an error.
    pub async fn revoke_token(&self, id: Uuid) -> Result<(), ClientError> {
        self.send_json(Method::DELETE, &format!("/api/v1/tokens/{id}"), None).await.map(drop)
    }

    // --- audit ---------------------------------------------------------------------

    /// `GET /audit?since=&limit=`: the user's audit events, newest first.
    /// One answer, not pages: `filter.limit` bounds it (500 when not given).
    pub async fn audit(&self, filter: &AuditFilter) -> Result<Vec<AuditEvent>, ClientError> {
        let path = "/api/v1/audit";
        let bytes = self.call(Method::GET, path, Some(filter), None).await?;
        let url = format!("{}{path}", self.server);
        take_list(&url, &decode(&url, &bytes)?, "events")
    }
}

/// The items of the list `key` in a list answer (`{"hosts":[...]}`).
fn take_list<T: DeserializeOwned>(url: &str, body: &Value, key: &str) -> Result<Vec<T>, ClientError> {
    match body.get(key) {
        Some(Value::Array(list)) => list.iter().map(|item| from_value(url, item.clone())).collect(),
        _ => Err(ClientError::Decode { url: url.to_owned(), message: format!("no `{key}` list") }),
    }
}

fn decode(url: &str, bytes: &[u8]) -> Result<Value, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode { url: url.to_owned(), message: e.to_string() })
}

fn from_value<T: DeserializeOwned>(url: &str, value: Value) -> Result<T, ClientError> {
    serde_json::from_value(value).map_err(|e| ClientError::Decode { url: url.to_owned(), message: e.to_string() })
}
