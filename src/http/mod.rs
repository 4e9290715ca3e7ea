//! The actix-web application: REST routes, operations endpoints, the web
//! page, JSON error mapping and per-request metrics.

pub mod body;
pub mod client_addr;
pub mod error;
pub mod ops;
pub mod origin;
pub mod page;
pub mod rest;
pub mod routes;
pub mod state;
pub mod token_lookups;
pub mod upgraded;
pub mod views;
pub mod ws;

use std::time::Instant;

use actix_web::dev::{Service, ServiceResponse};
use actix_web::web;

/// Registers the routes this instance serves: its rows of the route table
/// (`routes::ROUTES`), then, on a relay, the web page.
pub fn configure(cfg: &mut web::ServiceConfig, max_body_bytes: usize, serving: routes::Serving) {
    cfg.app_data(web::QueryConfig::default().error_handler(error::query_error))
        .app_data(body::BodyLimit(max_body_bytes))
        .configure(|cfg| routes::configure(cfg, serving))
        .configure(|cfg| {
            if serving.relay {
                page::configure(cfg);
            }
        })
        .default_service(web::to(|| async { Err::<actix_web::HttpResponse, _>(error::ApiError::not_found("route")) }));
}

/// Headers every response carries (docs/SECURITY.md, "What tether
/// promises"): no MIME sniffing, no Referer leaking a terminal's URL.
pub fn security_headers() -> actix_web::middleware::DefaultHeaders {
    actix_web::middleware::DefaultHeaders::new()
        .add((actix_web::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((actix_web::http::header::REFERRER_POLICY, "no-referrer"))
}

/// The routes of the `metrics.listen` listener: `/metrics` alone.
pub fn configure_metrics(cfg: &mut web::ServiceConfig) {
    cfg.route("/metrics", web::get().to(ops::metrics_only))
        .default_service(web::to(|| async { Err::<actix_web::HttpResponse, _>(error::ApiError::not_found("route")) }));
}

/// Counts requests and records latencies by route pattern (never by raw
/// path, which would make one series per id).
pub fn record_metrics<S, B>(
    req: actix_web::dev::ServiceRequest,
    srv: &S,
) -> impl std::future::Future<Output = Result<ServiceResponse<B>, actix_web::Error>> + 'static
where
    S: Service<actix_web::dev::ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: 'static,
{
    let started = Instant::now();
    let method = req.method().to_string();
    let route = req.match_pattern().unwrap_or_else(|| "unmatched".into());
    let fut = srv.call(req);
    async move {
        let res = fut.await?;
        let status = res.status().as_u16().to_string();
        metrics::counter!("tether_http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status)
            .increment(1);
        metrics::histogram!("tether_http_request_duration_seconds", "method" => method, "route" => route)
            .record(started.elapsed().as_secs_f64());
        Ok(res)
    }
}
