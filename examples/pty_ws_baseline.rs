//! The least a terminal relay can do, for tether to be measured against
//! (issue 10, docs/BENCHMARKS.md): one hop, a PTY read straight into
//! WebSocket frames. No database, no screen model, no protocol.
//!
//! Every WebSocket connection to any path starts a fresh PTY running the
//! command (default `bash --norc`) on an 80x24 grid, like a tether terminal.
//! Each PTY read becomes one binary frame as it is; every frame received,
//! binary or text, is written to the PTY as it is. The PTY is killed when
//! its socket closes.
//!
//! With `--shared` every connection watches and types into one PTY, started
//! by the first connection and kept until the process ends: a fan-out with
//! no queue but a small channel per socket, so the slowest viewer sets
//! the pace for all (nothing is dropped, nobody is closed).
//!
//! ```sh
//! cargo build --release --example pty_ws_baseline
//! target/release/examples/pty_ws_baseline [--listen 127.0.0.1:0] [--shared] [-- COMMAND ARGS...]
//! target/release/examples/pty_ws_baseline [--listen 127.0.0.1:0] --forward ADDR
//! ```
//!
//! With `--forward ADDR` it is no terminal at all but the least a second
//! hop can do: a TCP forwarder, one thread, that dials ADDR for every
//! connection and copies bytes both ways without looking at them. Put in
//! front of a baseline it is the least a two-hop relay (tether's viewer ->
//! server -> daemon) can cost: one more process and one more loopback
//! crossing each way.
//!
//! It prints `listening on ADDR` once bound. `examples/output_bench.rs`
//! starts it next to a real tether, and once more as a forwarder in front
//! of it.

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use actix_ws::Message;
use bytes::Bytes;
use portable_pty::{CommandBuilder, PtySize};
use tokio::sync::mpsc;

/// Bytes per PTY read.
const READ_CHUNK: usize = 64 * 1024;
/// PTY reads queued per socket before the reader thread waits for it.
const SOCKET_QUEUE_CHUNKS: usize = 16;
/// The forwarder's buffer per direction (one PTY read's worth).
const FORWARD_CHUNK: usize = 64 * 1024;

/// One PTY: where its output goes, and its input.
struct Pty {
    viewers: Arc<Mutex<Vec<mpsc::Sender<Bytes>>>>,
    input: std::sync::mpsc::Sender<Bytes>,
    child: Mutex<Box<dyn portable_pty::Child + Send + Sync>>,
}

impl Pty {
    /// Starts `argv` on a fresh 80x24 PTY with a reader and a writer thread.
    fn spawn(argv: &[String]) -> std::io::Result<Pty> {
        let pair = portable_pty::native_pty_system()
            .openpty(PtySize { rows: 24, cols: 80, pixel_width: 0, pixel_height: 0 })
            .map_err(std::io::Error::other)?;
        let mut command = CommandBuilder::from_argv(argv.iter().map(Into::into).collect());
        command.env("TERM", "xterm-256color");
        let child = pair.slave.spawn_command(command).map_err(std::io::Error::other)?;
        // The reader sees EOF only once every slave fd is closed, ours included.
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().map_err(std::io::Error::other)?;
        let mut writer = pair.master.take_writer().map_err(std::io::Error::other)?;
        let viewers: Arc<Mutex<Vec<mpsc::Sender<Bytes>>>> = Arc::default();
        let readers_viewers = viewers.clone();
        std::thread::spawn(move || {
            // Keeps the master open for as long as the PTY is read.
            let _master = pair.master;
            let mut buf = vec![0u8; READ_CHUNK];
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                let chunk = Bytes::copy_from_slice(&buf[..n]);
                let viewers: Vec<_> = readers_viewers.lock().map(|v| v.clone()).unwrap_or_default();
                for viewer in viewers {
                    // A closed socket's sender is dropped below.
                    let _ = viewer.blocking_send(chunk.clone());
                }
                if let Ok(mut v) = readers_viewers.lock() {
                    v.retain(|viewer| !viewer.is_closed());
                }
            }
            // EOF or EIO: the PTY hung up; dropping the senders ends the sockets.
            if let Ok(mut v) = readers_viewers.lock() {
                v.clear();
            }
        });
        let (input, input_rx) = std::sync::mpsc::channel::<Bytes>();
        std::thread::spawn(move || {
            for data in input_rx {
                if writer.write_all(&data).is_err() {
                    return;
                }
            }
        });
        Ok(Pty { viewers, input, child: Mutex::new(child) })
    }

    /// A new receiver of every chunk read from now on.
    fn subscribe(&self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(SOCKET_QUEUE_CHUNKS);
        if let Ok(mut viewers) = self.viewers.lock() {
            viewers.push(tx);
        }
        rx
    }

    fn kill(&self) {
        if let Ok(mut child) = self.child.lock() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

struct Config {
    argv: Vec<String>,
    /// The one PTY of `--shared`, once the first socket started it.
    shared: Option<Mutex<Option<Arc<Pty>>>>,
}

impl Config {
    /// The PTY a new socket attaches to, and whether the socket owns it.
    fn pty_for_socket(&self) -> std::io::Result<(Arc<Pty>, bool)> {
        let Some(shared) = &self.shared else {
            return Ok((Arc::new(Pty::spawn(&self.argv)?), true));
        };
        let mut shared = shared.lock().map_err(|_| std::io::Error::other("poisoned"))?;
        if let Some(pty) = shared.as_ref() {
            return Ok((pty.clone(), false));
        }
        let pty = Arc::new(Pty::spawn(&self.argv)?);
        *shared = Some(pty.clone());
        Ok((pty, false))
    }
}

async fn socket(req: HttpRequest, body: web::Payload, config: web::Data<Config>) -> actix_web::Result<HttpResponse> {
    let (pty, owned) = config.pty_for_socket().map_err(actix_web::error::ErrorInternalServerError)?;
    let (response, mut session, mut incoming) = actix_ws::handle(&req, body)?;
    let mut output = pty.subscribe();
    actix_web::rt::spawn(async move {
        loop {
            tokio::select! {
                chunk = output.recv() => match chunk {
                    Some(chunk) => if session.binary(chunk).await.is_err() { break },
                    None => break,
                },
                message = incoming.recv() => match message {
                    Some(Ok(Message::Binary(data))) => { let _ = pty.input.send(data); }
                    Some(Ok(Message::Text(text))) => { let _ = pty.input.send(text.into_bytes()); }
                    Some(Ok(Message::Ping(payload))) => { let _ = session.pong(&payload).await; }
                    Some(Ok(Message::Close(_)) | Err(_)) | None => break,
                    Some(Ok(_)) => {}
                },
            }
        }
        if owned {
            pty.kill();
        }
        let _ = session.close(None).await;
    });
    Ok(response)
}

/// `--forward`: every connection to `listen` is dialed on to `to` and the
/// bytes copied both ways as they come.
async fn forward(listen: &str, to: String) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (mut inbound, _) = listener.accept().await?;
        let to = to.clone();
        actix_web::rt::spawn(async move {
            let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await else { return };
            // As tether's server does: keystroke echoes must not wait for a delayed ACK.
            for stream in [&inbound, &outbound] {
                let _ = stream.set_nodelay(true);
            }
            let _ = tokio::io::copy_bidirectional_with_sizes(&mut inbound, &mut outbound, FORWARD_CHUNK, FORWARD_CHUNK)
                .await;
        });
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = "127.0.0.1:0".to_owned();
    let mut shared = false;
    let mut forward_to = None;
    let mut argv = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next().unwrap_or(listen),
            "--shared" => shared = true,
            "--forward" => forward_to = args.next(),
            "--" => argv.extend(args.by_ref()),
            other => return Err(std::io::Error::other(format!("unknown argument {other}"))),
        }
    }
    if let Some(to) = forward_to {
        return forward(&listen, to).await;
    }
    if argv.is_empty() {
        argv = vec!["bash".to_owned(), "--norc".to_owned()];
    }
    let config = web::Data::new(Config { argv, shared: shared.then(Mutex::default) });
    let server = HttpServer::new(move || App::new().app_data(config.clone()).default_service(web::get().to(socket)))
        // As tether's server does: keystroke echoes must not wait for a delayed ACK.
        .tcp_nodelay(true)
        .bind(listen)?;
    for addr in server.addrs() {
        println!("listening on {addr}");
    }
    server.run().await
}
