//! The operators' cell API (docs/REST.md, "Cells (cluster secret)") on a
//! real `tether serve`: `GET /internal/v1/cells` lists the registered cells
//! with their switch and effective row, `PUT .../admit-mode` writes the
//! switch as `tether cell set` does (every write bumps the generation);
//! the cluster secret is the only credential, and an instance without one
//! serves no `/internal` route.

mod support;

use serde_json::{json, Value};
use support::client::{create_token, Api};
use support::TetherServer;
use tether::cell::AdmitMode;
use tether::store::{CellRow, Store};

const SECRET: &str = "cells-api-cluster-secret-0123";

/// The store of a server's database (SQLite, or PostgreSQL with TETHER_TEST_BACKEND=postgres).
async fn store_of(server: &TetherServer) -> std::sync::Arc<dyn Store> {
    let mut settings = tether::config::Settings::default();
    settings.database.url = server.database_url();
    settings.database.sqlite_path = server.scratch_dir().join("tether.db");
    tether::store::open(&settings).await.expect("open the server's store")
}

#[actix_rt::test]
async fn the_switch_is_written_and_listed_with_the_cluster_secret() {
    // The server registers itself as relay-3 when it starts.
    let env = [("TETHER_CLUSTER__SECRET", SECRET), ("TETHER_CELL__ID", "relay-3")];
    let server = TetherServer::start(&env, &[]).await;
    let store = store_of(&server).await;
    let cell = |id: &str, pool, reserve| CellRow {
        cell_id: id.into(),
        url: format!("http://{id}:8080"),
        region: "eu-1".into(),
        pool_size: pool,
        reserve_pool_size: reserve,
    };
    store.register_cell(&cell("relay-1", 16, 12)).await.expect("register");
    store.register_cell(&cell("relay-2", 10, 10)).await.expect("register");
    store.write_cell_effective("relay-1", AdmitMode::Reserve, "boot-a").await.expect("effective");
    let cluster = Api::new(server.url(), SECRET);
    let path = "/internal/v1/cells/relay-1/admit-mode";

    let (status, body) = cluster.put(path, json!({"admitMode": "reserve", "deadManTripSlots": 2})).await;
    assert_eq!(status, 200, "{body}");
    let switch = &body["switch"];
    assert_eq!(
        (&switch["cellId"], &switch["admitMode"], &switch["deadManTripSlots"], &switch["generation"]),
        (&json!("relay-1"), &json!("reserve"), &json!(2), &json!(1)),
        "{body}"
    );
    let (_, body) = cluster.put(path, json!({})).await;
    assert_eq!((&body["switch"]["admitMode"], &body["switch"]["generation"]), (&json!("reserve"), &json!(2)));
    let (_, body) = cluster.put(path, json!({"deadManTripSlots": null})).await;
    assert_eq!(
        (&body["switch"]["deadManTripSlots"], &body["switch"]["generation"]),
        (&Value::Null, &json!(3)),
        "null removes the cap: {body}"
    );
    let (_, body) = cluster.put(path, json!({"admitMode": "db"})).await;
    assert_eq!((&body["switch"]["admitMode"], &body["switch"]["generation"]), (&json!("db"), &json!(4)));

    for (bad, code) in [
        (json!({"deadManTripSlots": 65}), "invalid_trip_slots"),
        (json!({"deadManTripSlots": -1}), "invalid_trip_slots"),
        (json!({"admitMode": "maybe"}), "bad_json"),
        (json!({"admit_mode": "db"}), "bad_json"),
        (json!({"admitMode": null}), "bad_json"),
    ] {
        let (status, body) = cluster.put(path, bad.clone()).await;
        assert_eq!((status, &body["error"]["code"]), (400, &json!(code)), "{bad}: {body}");
    }
    let too_long = "x".repeat(129);
    for bad_id in ["a%23b", "has%20space", "a%2Fb", "a%09b", "%FF", "%EF%BF%BD", too_long.as_str()] {
        let (status, body) = cluster.put(&format!("/internal/v1/cells/{bad_id}/admit-mode"), json!({})).await;
        assert_eq!((status, &body["error"]["code"]), (400, &json!("invalid_cell_id")), "{bad_id}: {body}");
    }
    let stored = store.cell_switch("relay-1").await.expect("read").expect("switch");
    assert_eq!((stored.admit_mode, stored.generation), (AdmitMode::Db, 4), "refused writes wrote nothing");

    let (status, body) = cluster.get("/internal/v1/cells").await;
    assert_eq!(status, 200, "{body}");
    let cells = body["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 3, "{body}");
    let one = &cells[0];
    assert_eq!(
        (&one["cellId"], &one["url"], &one["poolSize"], &one["reservePoolSize"]),
        (&json!("relay-1"), &json!("http://relay-1:8080"), &json!(16), &json!(12)),
        "{body}"
    );
    assert_eq!((&one["switch"]["admitMode"], &one["switch"]["generation"]), (&json!("db"), &json!(4)));
    assert_eq!(
        (&one["effective"]["mode"], &one["effective"]["cellIncarnation"]),
        (&json!("reserve"), &json!("boot-a"))
    );
    assert!(one["readAt"].is_string() && one["effective"]["updatedAt"].is_string(), "{body}");
    assert_eq!((&cells[1]["switch"], &cells[1]["effective"]), (&Value::Null, &Value::Null), "{body}");
    let own = &cells[2];
    assert_eq!((&own["cellId"], &own["url"]), (&json!("relay-3"), &json!(server.url())), "{body}");
    assert_eq!((&own["poolSize"], &own["reservePoolSize"]), (&json!(16), &json!(4)), "a quarter by default: {body}");

    // Only the secret opens the door: none, a wrong one, a user's full token.
    let full = create_token(&server, "ann");
    for token in ["", "cells-api-cluster-secret-0124", full.as_str()] {
        let api = Api::new(server.url(), token);
        let (status, body) = api.get("/internal/v1/cells").await;
        assert_eq!((status, &body["error"]["code"]), (401, &json!("unauthorized")), "{token:?}: {body}");
        let (status, _) = api.put(path, json!({"admitMode": "reserve"})).await;
        assert_eq!(status, 401, "{token:?}");
    }
    let stored = store.cell_switch("relay-1").await.expect("read").expect("switch");
    assert_eq!(stored.generation, 4, "refused callers wrote nothing");
}

#[actix_rt::test]
async fn an_instance_without_a_cluster_secret_serves_no_internal_route() {
    let server = TetherServer::start(&[], &[]).await;
    for token in ["", SECRET] {
        let api = Api::new(server.url(), token);
        let (status, body) = api.get("/internal/v1/cells").await;
        assert_eq!((status, &body["error"]["code"]), (403, &json!("cluster_secret_unset")), "{body}");
        let (status, body) = api.put("/internal/v1/cells/relay-1/admit-mode", json!({"admitMode": "db"})).await;
        assert_eq!((status, &body["error"]["code"]), (403, &json!("cluster_secret_unset")), "{body}");
    }
    let store = store_of(&server).await;
    assert_eq!(store.cell_switch("relay-1").await.expect("read"), None);
}
