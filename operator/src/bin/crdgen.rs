//! Prints the Composition CRD: `cargo run -p toa-operator --bin crdgen > crds/composition.yaml`.

fn main() {
    print!("{}", toa_operator::crd::crd_yaml());
}
