//! Operations endpoints (docs/REST.md, "Instance and operations"): `/healthz` (process up), `/readyz`
//! (database reachable, migrations applied, bus when configured),
//! `/metrics` (Prometheus text; on its own listener with `metrics.listen`)
//! and `/api/v1/instance`.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::error::ApiError;
use super::state::{AppState, Role};

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for each of its checks: a database or Redis
/// that hangs (rather than refuses) makes the instance unready, not the
/// probe hang.
const CHECK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// `check`, or an error once it has taken [`CHECK_PATIENCE`].
async fn within<T>(check: impl std::future::Future<Output = Result<T, String>>) -> Result<T, String> {
    tokio::time::timeout(CHECK_PATIENCE, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", CHECK_PATIENCE.as_secs())))
}

pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let store = async {
        state.store.ping().await.map_err(|e| e.to_string())?;
        state.store.schema_version().await.map_err(|e| e.to_string())
    };
    let bus = async {
        match state.relay.bus.redis() {
            None => Ok("not_configured".to_string()),
            Some(redis) => {
                redis.ping().await?;
                // Asked of Redis each time: after Redis came back (or a
                // Redis Cluster's shard failed over) the instance is ready
                // only once it is subscribed there again.
                let replies = state.relay.bus.reply_channel(&state.relay.instance_id);
                match redis.subscribed(&replies).await? {
                    true => Ok("ok".to_string()),
                    false => Err("not subscribed yet".to_string()),
                }
            }
        }
    };
    let (store, bus) = futures_util::future::join(within(store), within(bus)).await;
    let expected = crate::store::known_schema_version(state.store.as_ref());
    let (database, migrations) = match store {
        Ok(v) if v == expected => (Ok(()), Ok(v)),
        Ok(v) => (Ok(()), Err(format!("schema version {v}, expected {expected}"))),
        Err(e) => (Err(e.clone()), Err(e)),
    };
    let draining = state.draining.load(std::sync::atomic::Ordering::Relaxed);
    let ready = database.is_ok() && migrations.is_ok() && bus.is_ok() && !draining;
    let body = json!({
        "ready": ready,
        "checks": {
            "database": database.err().unwrap_or_else(|| "ok".into()),
            "migrations": migrations.map(|v| format!("ok (version {v})")).unwrap_or_else(|e| e),
            "bus": bus.unwrap_or_else(|e| format!("redis: {e}")),
            "drain": if draining { "draining" } else { "ok" },
        },
    });
    if ready {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// `/metrics` on the API listener: 404 once `metrics.listen` moved it.
pub async fn metrics(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.settings.metrics.listen.is_some() {
        return Err(ApiError::not_found("route"));
    }
    Ok(render_metrics(&state))
}

/// `/metrics` on the `metrics.listen` listener.
pub async fn metrics_only(state: web::Data<AppState>) -> HttpResponse {
    render_metrics(&state)
}

fn render_metrics(state: &AppState) -> HttpResponse {
    let high_water = crate::relay::viewer::QUEUE_HIGH_WATER.load(std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!("tether_viewer_queue_high_water_bytes").set(high_water as f64);
    let text = state.metrics.render(state.store.as_ref());
    HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(text)
}

/// The instance card: who this is and, for a cell, how it admits
/// (docs/REST.md, "Instance and operations").
pub async fn instance(state: web::Data<AppState>) -> HttpResponse {
    // A director admits no daemon: it reports db and nothing of a cell.
    if state.instance.role == Role::Director {
        return HttpResponse::Ok().json(json!({
            "instanceId": state.instance.instance_id,
            "cellId": state.instance.cell_id,
            "role": state.instance.role.as_str(),
            "admitMode": "db",
        }));
    }
    let cell = &state.relay.cell;
    let status = cell.status();
    HttpResponse::Ok().json(json!({
        "instanceId": state.instance.instance_id,
        "cellId": state.instance.cell_id,
        "role": state.instance.role.as_str(),
        // How hellos are admitted now: the switch, unless the trip made it db.
        "admitMode": status.mode,
        "cell": {
            "cellId": cell.cell_id,
            "switchAdmitMode": status.switch,
            "effectiveAdmitMode": status.mode,
            "tripped": status.tripped,
            "held": status.held,
            "directorHeardAt": cell.heard_from_director(),
        },
    }))
}
