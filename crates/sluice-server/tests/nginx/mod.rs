//! nginx as a reverse proxy on 127.0.0.1, for tests that hold the gateway beside it: one
//! process (`master_process off`), its configuration and logs in a directory of its own,
//! killed when dropped. `NGINX` names the binary (default `/usr/sbin/nginx`); a missing
//! binary fails the test, naming the package that brings it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, TempDir};

/// A running nginx.
pub struct Nginx {
    child: Child,
    /// Its h2c port (`listen ... http2`: HTTP/2 with prior knowledge).
    pub port: u16,
    dir: TempDir,
}

/// The nginx binary.
pub fn binary() -> String {
    let path = std::env::var("NGINX").unwrap_or_else(|_| "/usr/sbin/nginx".to_owned());
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} missing: install nginx (nginx-light), or set NGINX"
    );
    path
}

impl Nginx {
    /// nginx with `http_extra` directives in `http {}` and `location_extra` in the one
    /// `location /`, which proxies to `upstream` (`host:port`) over HTTP/1.1 keep-alive,
    /// listening for h2c on a free port; waits until the port accepts.
    pub async fn start(upstream: &str, http_extra: &str, location_extra: &str) -> Nginx {
        let dir = TempDir::new();
        let root = dir.0.clone();
        std::fs::create_dir_all(root.join("logs")).unwrap();
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let port = free_port();
        let conf = format!(
            r#"
worker_processes 1;
master_process off;
daemon off;
pid {root}/nginx.pid;
error_log {root}/logs/error.log info;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {root}/tmp/body;
  proxy_temp_path {root}/tmp/proxy;
  fastcgi_temp_path {root}/tmp/fastcgi;
  uwsgi_temp_path {root}/tmp/uwsgi;
  scgi_temp_path {root}/tmp/scgi;
  upstream up {{ server {upstream}; keepalive 16; }}
  {http_extra}
  server {{
    listen 127.0.0.1:{port} http2;
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      {location_extra}
    }}
  }}
}}
"#,
            root = root.display()
        );
        let path: PathBuf = root.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = Command::new(binary())
            .arg("-p")
            .arg(&root)
            .arg("-c")
            .arg(&path)
            .arg("-e")
            .arg(root.join("logs/error.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nginx did not listen within 10 s: {}",
                std::fs::read_to_string(root.join("logs/error.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Nginx { child, port, dir }
    }

    /// Its error log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.0.join("logs/error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
