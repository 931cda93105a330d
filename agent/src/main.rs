fn main() { println!("haptic-agent --help"); }
