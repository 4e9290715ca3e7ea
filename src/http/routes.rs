//! The route table: every REST route and both sockets, each with the
//! [`Access`] it asks of a token (docs/REST.md, "Scopes"). The router is
//! built from [`ROUTES`] and nothing else, and its middleware checks the
//! token against the row's access before any extractor or handler runs, so
//! a route cannot be added without saying who may call it, and the
//! authorization matrix test (tests/authz_matrix.rs) walks the same table.
//!
//! REST routes: no usable token is 401, a scope that does not reach the
//! route is 403 (`insufficient_scope`); whether the resource is the caller's
//! is the handler's check (404). `/internal/...` routes take the cluster
//! secret instead of a token: a missing or wrong one is 401, and an
//! instance without `cluster.secret` answers 403 `cluster_secret_unset`. Sockets authenticate in their handlers
//! (`super::ws`) because a refusal there is a close code (4401/4403).

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::{from_fn, Next};
use actix_web::{web, HttpMessage, ResponseError};

use super::error::ApiError;
use super::state::{authenticate, AppState, Role};
use super::{ops, rest, ws};
use crate::auth::{self, Access};

/// One route: method, path pattern, what it asks of a token, which
/// instances serve it, its handler.
pub struct RouteSpec {
    pub method: &'static str,
    pub path: &'static str,
    pub access: Access,
    pub served: Served,
    handler: fn(actix_web::Route) -> actix_web::Route,
}

/// Which instances serve a route (docs/CELLS.md, "Running a director").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The relay: `combined` and `cell` instances.
    Relay,
    /// Placement: `director` instances, and `combined` ones with `director.enabled`.
    Placement,
    /// Every instance: operations, and host registration (a daemon pointed
    /// at a director registers there before it asks where to dial).
    Always,
}

/// What one instance serves, from its role and `director.enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    pub relay: bool,
    pub placement: bool,
}

impl Serving {
    pub fn of(role: Role, director_enabled: bool) -> Self {
        match role {
            Role::Combined => Self { relay: true, placement: director_enabled },
            Role::Cell => Self { relay: true, placement: false },
            Role::Director => Self { relay: false, placement: true },
        }
    }

    pub fn serves(self, spec: &RouteSpec) -> bool {
        match spec.served {
            Served::Relay => self.relay,
            Served::Placement => self.placement,
            Served::Always => true,
        }
    }
}

impl RouteSpec {
    /// True for the two WebSocket upgrades.
    pub fn is_socket(&self) -> bool {
        matches!(self.access, Access::DaemonSocket | Access::ViewerSocket)
    }
}

macro_rules! route {
    ($method:literal, $path:literal, $access:ident, $handler:path) => {
        route!($method, $path, $access, $handler, Relay)
    };
    ($method:literal, $path:literal, $access:ident, $handler:path, $served:ident) => {
        RouteSpec {
            method: $method,
            path: $path,
            access: Access::$access,
            served: Served::$served,
            handler: |r| r.to($handler),
        }
    };
}

/// Every route the API serves besides the web page's static files.
pub const ROUTES: &[RouteSpec] = &[
    route!("GET", "/healthz", Public, ops::healthz, Always),
    route!("GET", "/readyz", Public, ops::readyz, Always),
    route!("GET", "/metrics", Public, ops::metrics, Always),
    route!("GET", "/ws/v1/daemon", DaemonSocket, ws::daemon),
    route!("GET", "/ws/v1/terminals/{id}", ViewerSocket, ws::terminal),
    route!("GET", "/api/v1/instance", Public, ops::instance, Always),
    route!("POST", "/api/v1/hosts", RegisterHost, rest::hosts::register, Always),
    route!("GET", "/api/v1/hosts", Read, rest::hosts::list),
    route!("GET", "/api/v1/hosts/{id}", Read, rest::hosts::get),
    route!("DELETE", "/api/v1/hosts/{id}", Control, rest::hosts::delete),
    route!("POST", "/api/v1/hosts/{id}/dirs", Control, rest::hosts::add_dir),
    route!("DELETE", "/api/v1/hosts/{id}/dirs", Control, rest::hosts::remove_dir),
    route!("POST", "/api/v1/hosts/{id}/limits/refresh", Control, rest::hosts::refresh_limits),
    route!("POST", "/api/v1/hosts/{id}/credentials/refresh", Control, rest::hosts::refresh_credentials),
    route!("POST", "/api/v1/terminals", Control, rest::terminals::create),
    route!("GET", "/api/v1/terminals", Read, rest::terminals::list),
    route!("GET", "/api/v1/terminals/{id}", ReadTerminal, rest::terminals::get),
    route!("DELETE", "/api/v1/terminals/{id}", Control, rest::terminals::delete),
    route!("POST", "/api/v1/terminals/{id}/input", Control, rest::terminals::input),
    route!("POST", "/api/v1/terminals/{id}/resize", Control, rest::terminals::resize),
    route!("POST", "/api/v1/terminals/{id}/kill", Control, rest::terminals::kill),
    route!("POST", "/api/v1/runs", Control, rest::runs::create),
    route!("GET", "/api/v1/runs", Read, rest::runs::list),
    route!("GET", "/api/v1/runs/{id}", Read, rest::runs::get),
    route!("GET", "/api/v1/runs/{id}/log", Read, rest::runs::log),
    route!("GET", "/api/v1/audit", Control, rest::audit::list),
    route!("GET", "/api/v1/tokens", Control, rest::tokens::list),
    route!("POST", "/api/v1/tokens", Control, rest::tokens::create),
    route!("DELETE", "/api/v1/tokens/{id}", Control, rest::tokens::revoke),
    route!("GET", "/internal/v1/cells", ClusterSecret, rest::cells::list),
    route!("PUT", "/internal/v1/cells/{cellId}/admit-mode", ClusterSecret, rest::cells::set_admit_mode),
    route!("POST", "/v1/assign", Assign, rest::assign::assign, Placement),
    route!("GET", "/internal/v1/seats", ClusterSecret, rest::cell_seats::seats),
    route!("POST", "/internal/v1/reserve", ClusterSecret, rest::cell_seats::reserve),
];

/// Registers the rows of [`ROUTES`] this instance serves: one resource per
/// path, each behind [`authorize`]. A route it does not serve is 404.
pub fn configure(cfg: &mut web::ServiceConfig, serving: Serving) {
    cfg.app_data(web::Data::new(serving));
    let mut paths: Vec<&'static str> = Vec::new();
    for spec in ROUTES.iter().filter(|s| serving.serves(s)) {
        if !paths.contains(&spec.path) {
            paths.push(spec.path);
        }
    }
    for path in paths {
        let mut resource = web::resource(path);
        for spec in ROUTES.iter().filter(|s| s.path == path && serving.serves(s)) {
            let method = Method::from_bytes(spec.method.as_bytes()).unwrap_or(Method::GET);
            // HEAD is a GET without its body (RFC 9110, 9.3.2): the same
            // handler, checks and headers; the server sends no body.
            if method == Method::GET && !spec.is_socket() {
                resource = resource.route((spec.handler)(web::route().method(Method::HEAD)));
            }
            resource = resource.route((spec.handler)(web::route().method(method)));
        }
        cfg.service(resource.wrap(from_fn(authorize)));
    }
}

/// The rows of the path a request matched that this instance serves.
fn served_rows(req: &ServiceRequest) -> impl Iterator<Item = &'static RouteSpec> {
    let pattern = req.match_pattern();
    let serving: Option<Serving> = req.app_data::<web::Data<Serving>>().map(|s| *s.get_ref());
    ROUTES.iter().filter(move |s| Some(s.path) == pattern.as_deref() && serving.is_none_or(|serving| serving.serves(s)))
}

/// The table row a request matched (a HEAD matches its path's GET).
fn spec_of(req: &ServiceRequest) -> Option<&'static RouteSpec> {
    let head = req.method() == Method::HEAD;
    let method = if head { "GET" } else { req.method().as_str() };
    served_rows(req).find(|s| s.method == method && !(head && s.is_socket()))
}

/// The methods a path serves, for the `Allow` header of a 405.
fn allowed(req: &ServiceRequest) -> String {
    let mut methods: Vec<&str> = Vec::new();
    for spec in served_rows(req) {
        if spec.method == "GET" && !spec.is_socket() {
            methods.push("HEAD");
        }
        methods.push(spec.method);
    }
    methods.join(", ")
}

/// Authenticates a REST request and checks its scope against the route's
/// access; the principal goes into the request's extensions for `AuthUser`.
async fn authorize(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(spec) = spec_of(&req) else {
        // Only a method the resource does not serve gets here.
        let res = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed");
        let mut res = res.error_response();
        if let Ok(allow) = actix_web::http::header::HeaderValue::from_str(&allowed(&req)) {
            res.headers_mut().insert(actix_web::http::header::ALLOW, allow);
        }
        return Ok(req.into_response(res).map_into_right_body());
    };
    if spec.access == Access::Public || spec.is_socket() {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let Some(state) = req.app_data::<web::Data<AppState>>().cloned() else {
        return Ok(req.into_response(ApiError::internal().error_response()).map_into_right_body());
    };
    if spec.access == Access::ClusterSecret {
        return match cluster_caller(&state, req.request()) {
            Ok(()) => Ok(next.call(req).await?.map_into_left_body()),
            Err(e) => Ok(req.into_response(e.error_response()).map_into_right_body()),
        };
    }
    let principal = match authenticate(&state, auth::bearer_token(req.request())).await {
        Ok((principal, _)) => principal,
        Err(e) => return Ok(req.into_response(e.error_response()).map_into_right_body()),
    };
    if let Err(denied) = principal.may(spec.access, req.match_info().get("id")) {
        let res = ApiError::new(StatusCode::FORBIDDEN, "insufficient_scope", denied.to_string());
        return Ok(req.into_response(res.error_response()).map_into_right_body());
    }
    req.extensions_mut().insert(principal);
    Ok(next.call(req).await?.map_into_left_body())
}

/// Checks the cluster secret of an `/internal/...` request.
fn cluster_caller(state: &AppState, req: &actix_web::HttpRequest) -> Result<(), ApiError> {
    let Some(configured) = state.settings.cluster.secret.as_deref() else {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "cluster_secret_unset",
            "this instance has no cluster.secret, so it serves no /internal routes",
        ));
    };
    match auth::bearer_token(req) {
        Some(presented) if auth::is_cluster_secret(configured, &presented) => Ok(()),
        _ => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the cluster secret is required (Authorization: Bearer <cluster.secret>)",
        )),
    }
}
