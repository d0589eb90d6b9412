//! The `protocol` label of the gateway's metrics (`http1`, `h2`, `grpc`, `ws`) and the
//! RateLimit fields, the same over HTTP/1.1 and HTTP/2 (h2c).

mod common;

use bytes::Bytes;
use common::{Gateway, Upstream};
use http::Request;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_protocol_is_counted_under_its_label_with_the_same_fields() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true",
        &format!(
            "[[policy]]\nname = \"api\"\ncapacity = 100\nrate = \"1/h\"\n\n[[route]]\npath_prefix = \"/api/\"\npolicies = [\"api\"]\nupstream = \"{}\"\n",
            upstream.url()
        ),
    )
    .await;
    let h1 = common::get(&gw.url("/api/a")).await.unwrap();
    assert_eq!(h1.status, 200);
    assert_eq!(
        h1.header("ratelimit-policy"),
        Some(r#""api";q=100;w=360000"#)
    );
    assert_eq!(h1.header("ratelimit"), Some(r#""api";r=99;t=3600"#));

    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    let (mut h2, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let plain = h2
        .send_request(
            Request::get(gw.url("/api/b"))
                .body(Full::<Bytes>::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(plain.version(), http::Version::HTTP_2);
    assert_eq!(plain.status(), 200);
    assert_eq!(
        plain.headers()["ratelimit-policy"],
        r#""api";q=100;w=360000"#
    );
    assert_eq!(plain.headers()["ratelimit"], r#""api";r=98;t=7200"#);
    plain.into_body().collect().await.unwrap();
    let grpc = h2
        .send_request(
            Request::post(gw.url("/api/pkg.Svc/Call"))
                .header("content-type", "application/grpc")
                .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(grpc.status(), 200);
    assert_eq!(grpc.headers()["ratelimit"], r#""api";r=97;t=10800"#);
    grpc.into_body().collect().await.unwrap();

    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    for (protocol, n) in [("http1", 1), ("h2", 1), ("grpc", 1), ("ws", 0)] {
        let line =
            format!(r#"sluice_policy_admitted_total{{policy="api",protocol="{protocol}"}} {n}"#);
        assert!(text.contains(&line), "no {line} in\n{text}");
        let line = format!(
            r#"sluice_upstream_responses_total{{route="/api/",status="2xx",protocol="{protocol}"}} {n}"#
        );
        assert!(text.contains(&line), "no {line} in\n{text}");
    }
}
