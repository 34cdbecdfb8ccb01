//! The server end to end over real sockets: unary and streamed steps, per-request errors,
//! statuses naming the field, health, and graceful shutdown of open streams.

use std::time::Duration;

use lookahead_server::pb::lookahead_client::LookaheadClient;
use lookahead_server::pb::{ErrorCode, RequestStep, StatsRequest, StepRequest, TokenList};
use lookahead_server::{BoundAddr, ListenAddr, ServerConfig, bind};
use tokio::sync::oneshot;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

struct Running {
    tcp: String,
    socket: std::path::PathBuf,
    stop: oneshot::Sender<()>,
    done: tokio::task::JoinHandle<Result<(), lookahead_server::ServerError>>,
    _dir: tempfile::TempDir,
}

async fn start() -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("l.sock");
    let config = ServerConfig {
        listen: vec![
            ListenAddr::Tcp("127.0.0.1:0".into()),
            ListenAddr::Unix(socket.clone()),
        ],
        max_message_bytes: 64 << 10,
        shutdown_grace: Duration::from_secs(2),
        ..ServerConfig::default()
    };
    let server = bind(&config).await.expect("binds");
    let addrs = server.local_addrs();
    let tcp = match &addrs[0] {
        BoundAddr::Tcp(addr) => format!("http://{addr}"),
        other => panic!("expected a TCP address first, got {other}"),
    };
    assert_eq!(addrs[1], BoundAddr::Unix(socket.clone()));
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(server.serve(async move {
        let _ = stopped.await;
    }));
    Running {
        tcp,
        socket,
        stop,
        done,
        _dir: dir,
    }
}

fn request(id: &str, prompt: Option<Vec<i64>>, new_tokens: Vec<i64>, budget: i32) -> RequestStep {
    RequestStep {
        request_id: id.into(),
        prompt: prompt.map(|tokens| TokenList { tokens }),
        new_tokens,
        budget,
        ..RequestStep::default()
    }
}

#[tokio::test]
async fn steps_errors_health_and_shutdown() {
    let server = start().await;
    assert!(
        server.socket.exists(),
        "the Unix socket file exists while serving"
    );
    let channel = tonic::transport::Endpoint::from_shared(server.tcp.clone())
        .expect("endpoint")
        .connect()
        .await
        .expect("connects");
    let mut client = LookaheadClient::new(channel.clone());

    // Health answers SERVING for the whole server and for the service.
    let mut health = HealthClient::new(channel);
    for service in ["", "lookahead.v1.Lookahead"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers")
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "service {service:?}");
    }

    // A unary step: one good request, one bad; the bad one does not fail the call.
    let response = client
        .step(StepRequest {
            cost: None,
            replica: String::new(),
            namespace: "t".into(),
            step_id: 1,
            requests: vec![
                request("a", Some(vec![1, 2, 3, 1, 2]), vec![], 4),
                request("b", Some(vec![1, -5]), vec![], 4),
            ],
        })
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(response.roots, vec![2, -1]);
    assert_eq!(response.errors.len(), 1);
    let err = &response.errors[0];
    assert_eq!(err.index, 1);
    assert_eq!(
        (err.code, err.field.as_str()),
        (ErrorCode::InvalidArgument as i32, "prompt")
    );

    // A bad namespace fails the unary call with INVALID_ARGUMENT naming the field.
    let status = client
        .step(StepRequest {
            cost: None,
            replica: String::new(),
            namespace: "bad name".into(),
            ..StepRequest::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        status
            .metadata()
            .get("lookahead-field")
            .and_then(|v| v.to_str().ok()),
        Some("namespace")
    );

    // Stats of an unknown namespace: NOT_FOUND.
    let status = client
        .stats(StatsRequest {
            namespace: "nope".into(),
        })
        .await
        .expect_err("not found");
    assert_eq!(status.code(), tonic::Code::NotFound);

    // A message above the limit is refused, and the server keeps serving.
    let big = StepRequest {
        cost: None,
        replica: String::new(),
        namespace: "t".into(),
        step_id: 2,
        requests: vec![request("big", Some(vec![100_000; 40_000]), vec![], 0)],
    };
    let status = client.step(big).await.expect_err("too large");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    let stats = client
        .stats(StatsRequest {
            namespace: "t".into(),
        })
        .await
        .expect("still serving")
        .into_inner();
    assert_eq!(stats.active_requests, 1);

    // A stream: answers in order with the step ids; a refused step does not end the stream.
    let (tx, rx) = tokio::sync::mpsc::channel::<StepRequest>(4);
    let mut answers = client
        .step_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream opens")
        .into_inner();
    tx.send(StepRequest {
        cost: None,
        replica: String::new(),
        namespace: "t".into(),
        step_id: 10,
        requests: vec![request("a", None, vec![3], 4)],
    })
    .await
    .expect("sent");
    let first = answers.message().await.expect("ok").expect("answer");
    assert_eq!(first.step_id, 10);
    assert_eq!(first.roots, vec![3]);
    tx.send(StepRequest {
        cost: None,
        replica: String::new(),
        namespace: "bad name".into(),
        step_id: 11,
        requests: vec![],
    })
    .await
    .expect("sent");
    let refused = answers.message().await.expect("ok").expect("answer");
    assert_eq!(refused.step_id, 11);
    assert_eq!(
        refused.error.as_ref().map(|e| e.field.as_str()),
        Some("namespace")
    );

    // Shutdown: the open stream ends with UNAVAILABLE, the server stops, the socket goes.
    server.stop.send(()).expect("server running");
    let end = tokio::time::timeout(Duration::from_secs(5), answers.message())
        .await
        .expect("the stream ends promptly");
    match end {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable),
        Ok(other) => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    drop(tx);
    tokio::time::timeout(Duration::from_secs(5), server.done)
        .await
        .expect("stops within the grace")
        .expect("task")
        .expect("clean stop");
    assert!(
        !server.socket.exists(),
        "the socket file is removed on shutdown"
    );
}
