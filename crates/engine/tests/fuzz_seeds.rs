//! Replays the committed seed corpus of the Rust fuzz targets (`fuzz/seeds/{plan_file,
//! weight_rows,neuron_store_header}`, valid files and the inputs of past findings) through the same checks the
//! cargo-fuzz targets run, on the stable toolchain, so `cargo test` keeps them fixed.

#[path = "../../../fuzz/src/checks.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        check(&std::fs::read(&path).unwrap());
        n += 1;
    }
    assert!(n > 0, "no seeds in {}", dir.display());
}

#[test]
fn plan_file_seeds() {
    replay("plan_file", checks::plan_file);
}

#[test]
fn weight_rows_seeds() {
    replay("weight_rows", checks::weight_rows);
}

#[test]
fn neuron_store_header_seeds() {
    replay("neuron_store_header", checks::neuron_store_header);
}
