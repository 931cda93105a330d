fn main() { println!("haptic-controller --help"); }
