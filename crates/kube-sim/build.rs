//! Compiles the vendored Kubernetes `generated.proto` files (see `proto/README.md`) into one
//! descriptor set that `src/proto.rs` uses to transcode stored JSON objects to and from
//! `application/vnd.kubernetes.protobuf`. protox is a pure-Rust compiler: no `protoc` needed.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let mut files = Vec::new();
    collect(&PathBuf::from("proto"), &mut files)?;
    files.sort();
    let fds = protox::Compiler::new(["proto"])?
        .include_imports(true)
        .include_source_info(false)
        .open_files(files.iter().map(|f| f.strip_prefix("proto").unwrap_or(f)))?
        .encode_file_descriptor_set();
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("k8s.fds");
    std::fs::write(out, fds)?;
    Ok(())
}

fn collect(dir: &PathBuf, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
