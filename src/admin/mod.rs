//! The admin listener: health and the fence table, on its own address
//! (loopback by default), never on the S3 port.

use crate::fence::gate::Gate;
use crate::proxy::{BoxError, ProxyBody};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use percent_encoding::percent_decode_str;
use std::sync::Arc;

pub struct Admin {
    pub gate: Arc<Gate>,
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<ProxyBody> {
    let body = Full::new(Bytes::from(value.to_string()))
        .map_err(|never| -> BoxError { match never {} })
        .boxed();
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

impl Admin {
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<ProxyBody> {
        let path = req.uri().path().to_string();
        match (req.method(), path.as_str()) {
            (&Method::GET, "/healthz") => json(StatusCode::OK, serde_json::json!({"status": "ok"})),
            (&Method::GET, "/readyz") => match self.gate.store().get("").await {
                Ok(_) => json(StatusCode::OK, serde_json::json!({"status": "ready"})),
                Err(e) => json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({"status": "not ready", "error": e.to_string()}),
                ),
            },
            (&Method::GET, p) if p.starts_with("/fences/") => {
                let resource = percent_decode_str(&p["/fences/".len()..])
                    .decode_utf8_lossy()
                    .into_owned();
                match self.gate.highest(&resource).await {
                    Ok(Some(h)) => json(
                        StatusCode::OK,
                        serde_json::json!({"resource": resource, "highest": h}),
                    ),
                    Ok(None) => json(
                        StatusCode::NOT_FOUND,
                        serde_json::json!({"resource": resource, "error": "no fence recorded"}),
                    ),
                    Err(e) => json(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        serde_json::json!({"error": e.to_string()}),
                    ),
                }
            }
            _ => json(
                StatusCode::NOT_FOUND,
                serde_json::json!({"error": "not found"}),
            ),
        }
    }
}
